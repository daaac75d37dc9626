#!/usr/bin/env bash
# The demo's package set is enough, and no more than the binaries need (issue 33, "start in
# minutes"): scripts/setup.sh --demo lists a part of --all (the default) without the tests' and
# benchmarks' tools, and scripts/demo.sh's configure (scripts/demo_build.sh) finds every
# program, library and CMake package it uses in a Debian package that the demo set installs: one
# of the set or a package they depend on. A find_package added outside tests/ and bench/ whose
# package is missing from the demo set fails here, naming the file and its package.
#
# Usage: demo_packages_test.sh SOURCE_DIR WORK_DIR (WORK_DIR is emptied and configured into).
set -euo pipefail
src=$1
work=$2
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

demo=$(bash "$src/scripts/setup.sh" --demo --list)
all=$(bash "$src/scripts/setup.sh" --all --list)
[[ $(bash "$src/scripts/setup.sh" --list) == "$all" ]] || fail "setup.sh without a set is not --all"
for p in $demo; do
  grep -qx -- "$p" <<<"$all" || fail "$p is in --demo but not in --all"
done
for p in ccache clang podman runc prometheus python3-matplotlib python3-pytest libgtest-dev \
  libgmock-dev libbenchmark-dev libopenblas-dev; do
  if grep -qx -- "$p" <<<"$demo"; then fail "$p (tests, benchmarks or options only) is in --demo"; fi
done
if bash "$src/scripts/setup.sh" --bogus >/dev/null 2>&1; then fail "setup.sh --bogus succeeded"; fi

# The demo set and everything it depends on (installed here, as the test's build needs them).
# shellcheck disable=SC2086
closure=$(apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances $demo | grep -v '^ ' | sed 's/:.*//' | sort -u)
for p in $demo; do
  grep -qx -- "$p" <<<"$closure" || fail "$p (demo set) is not installed"
done

rm -rf "$work"
# shellcheck source=scripts/demo_build.sh
source "$src/scripts/demo_build.sh"
demo_configure "$src" "$work" >"$work.log" 2>&1 || {
  cat "$work.log" >&2
  fail "the demo's configure failed"
  exit 1
}

# The packages holding `path` (dpkg -S prints "pkg[:arch][, pkg...]: path"), one a line; none if
# no package does.
owners_of() {
  { dpkg -S "$1" 2>/dev/null || true; } | sed 's/: .*//' | tr ',' '\n' | sed 's/^ *//; s/:.*//' |
    sort -u
}

# Every absolute path the configure found (CMake package directories, programs, libraries,
# include directories), except the optional finds: ccache (CCACHE_PROGRAM), a BLAS (only for
# -DPIPETRAIN_USE_BLAS=ON) and git (GIT_EXECUTABLE: the commit --version prints, when there is one).
checked=0
while IFS='=' read -r entry path; do
  name=${entry%%:*}
  case "$name" in
    CCACHE_PROGRAM | BLAS_* | GIT_EXECUTABLE | CMAKE_INSTALL_*) continue ;;
  esac
  [[ -e $path ]] || continue
  # The package of the path as found (libz.so: zlib1g-dev), else of what it resolves to (a
  # symlink made by update-alternatives); with merged /usr, dpkg may know /lib/... for /usr/lib/...
  real=$(readlink -f "$path")
  owners=""
  for candidate in "$path" "$real" "${real#/usr}"; do
    owners=$(owners_of "$candidate")
    [[ -z $owners ]] || break
  done
  if [[ -z $owners ]]; then
    fail "$name=$path ($real) belongs to no Debian package"
    continue
  fi
  ok=false
  for o in $owners; do
    if grep -qx -- "$o" <<<"$closure"; then ok=true; fi
  done
  $ok || fail "$name=$path is in $(echo $owners), outside the demo set and its dependencies"
  checked=$((checked + 1))
done < <(grep -E '^[A-Za-z0-9_.+-]+:(PATH|FILEPATH)=/' "$work/CMakeCache.txt")
((checked >= 20)) || fail "only $checked paths checked in $work/CMakeCache.txt"

# The demo's build has the three binaries and no test or benchmark.
targets=$(ninja -C "$work" -t targets all 2>/dev/null | sed 's/:.*//')
for t in "${DEMO_TARGETS[@]}"; do
  grep -qx -- "$t" <<<"$targets" || fail "no target $t in the demo's build"
done
if grep -E '(_test|_bench)$' <<<"$targets" | head -3 | grep -q .; then
  fail "the demo's build has tests or benchmarks: $(grep -E '(_test|_bench)$' <<<"$targets" | head -3)"
fi

echo "demo_packages: $checked paths checked, $failures failures"
((failures == 0))
