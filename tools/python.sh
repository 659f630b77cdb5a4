#!/usr/bin/env bash
# Build (once) a CPython that this machine lacks, and a venv with torch and kiln's test extras for it.
#
#   bash tools/python.sh 3.13          # prints the venv's python on the last line
#   bash tools/python.sh 3.14
#   KILN_TORCH=torch==2.15.0 bash tools/python.sh 3.13   # another torch: a venv of its own
#
# The interpreter comes from Debian's source packages (upstream tarball only; Debian's patches are not
# applied): suite trixie carries 3.13, sid carries 3.14. Interpreters and venvs are cached under
# $KILN_PYTHONS (default ~/.cache/kiln/pythons), keyed by version, so CI and every developer on a machine
# build each one once. Set KILN_PYTHON_JOBS to change make's -j (default: the number of cores).
set -euo pipefail
version="${1:?usage: tools/python.sh 3.13|3.14}"
case "$version" in
  3.13) suite=trixie ;;
  3.14) suite=sid ;;
  *) echo "tools/python.sh: no Debian source for Python $version (3.13 and 3.14 are known)" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${KILN_PYTHONS:-${HOME:-/root}/.cache/kiln/pythons}"
prefix="$cache/$version"
venv="$cache/venv-$version"
[ -z "${KILN_TORCH:-}" ] || venv="$venv-$(printf %s "$KILN_TORCH" | tr -c 'A-Za-z0-9.\n' '-')"
jobs="${KILN_PYTHON_JOBS:-$(nproc)}"
torch_spec="${KILN_TORCH:-torch==2.13.0}"
mkdir -p "$cache"
log="$cache/build-$version.log"

if [ ! -x "$prefix/bin/python$version" ]; then
  echo "tools/python.sh: building CPython $version into $prefix (log: $log)" >&2
  src="$cache/src-$version"
  rm -rf "$src" && mkdir -p "$src"
  list=/etc/apt/sources.list.d/kiln-src-$suite.sources
  if [ ! -f "$list" ]; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      "$suite" > "$list"
  fi
  apt-get update -o Dir::Etc::sourcelist="$list" -o Dir::Etc::sourceparts=- \
    -o APT::Get::List-Cleanup=0 >>"$log" 2>&1
  # the newest version whose files the mirror serves (an index can name one the pool no longer has)
  fetched=
  for v in $(apt-cache showsrc "python$version" 2>/dev/null | sed -n 's/^Version: //p' | sort -rV | uniq); do
    if (cd "$src" && apt-get source --download-only "python$version=$v" >>"$log" 2>&1); then fetched=$v; break; fi
  done
  [ -n "$fetched" ] || { echo "tools/python.sh: no python$version source could be fetched (log: $log)" >&2; exit 1; }
  tarball="$(ls "$src"/python"$version"_*.orig.tar.xz | head -n 1)"
  tar -C "$src" -xf "$tarball"
  dir="$(find "$src" -maxdepth 1 -type d -name 'Python-*' | head -n 1)"
  (cd "$dir" && ./configure --prefix="$prefix" --with-ensurepip=install >>"$log" 2>&1 \
    && make -j"$jobs" >>"$log" 2>&1 && make install >>"$log" 2>&1)
  rm -rf "$src"
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, pytest" >/dev/null 2>&1; then
  echo "tools/python.sh: venv $venv with $torch_spec (the registry's build; several GB the first time)" >&2
  rm -rf "$venv"
  "$prefix/bin/python$version" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip >>"$log" 2>&1 || true
  "$venv/bin/python" -m pip install --quiet "$torch_spec" >>"$log" 2>&1
fi
# kiln and its test extras, editable, from this checkout (cheap once installed; redone so the venv follows the
# checkout it is run from)
"$venv/bin/python" -m pip install --quiet "$torch_spec" -e "$root[test]" >>"$log" 2>&1
echo "$venv/bin/python"
