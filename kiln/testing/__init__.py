"""Testing support shared by tests and bench: the OpInfo coverage harness (`kiln.testing.opinfo`).

`python -m kiln.testing.opinfo --help` runs torch's OpInfo database through kiln against eager.
"""
