#!/usr/bin/env bash
# Builds and installs xccl's C library under PREFIX (default /usr/local):
#   PREFIX/lib/libxccl.so.VERSION (soname libxccl.so.0, with the links libxccl.so.0 and
#   libxccl.so), PREFIX/lib/libxccl.a, PREFIX/include/xccl.h, PREFIX/lib/pkgconfig/xccl.pc.
# PROFILE=debug installs the development build instead of the release one. Then:
#   cc prog.c $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs xccl)
# and, for a static program, PREFIX/lib/libxccl.a $(pkg-config --static --libs-only-l xccl
# | sed 's/-lxccl//').
set -euo pipefail
prefix="${1:-/usr/local}"
profile="${PROFILE:-release}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
case "$profile" in
  release) flags=(--release) ;;
  debug) flags=() ;;
  *) echo "install.sh: PROFILE is release or debug, not '$profile'" >&2; exit 2 ;;
esac
cargo build --quiet "${flags[@]}" -p xccl-c --manifest-path "$root/Cargo.toml"
target="${CARGO_TARGET_DIR:-$root/target}/$profile"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
# What a static program needs beside libxccl.a (rustc's list for this platform).
native=$(cargo rustc --quiet "${flags[@]}" -p xccl-c --manifest-path "$root/Cargo.toml" --lib \
  --crate-type staticlib -- --print native-static-libs 2>&1 | sed -n 's/.*native-static-libs: //p' | tail -n 1)
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
cp "$target/libxccl.so" "$prefix/lib/libxccl.so.$version"
ln -sf "libxccl.so.$version" "$prefix/lib/libxccl.so.0"
ln -sf "libxccl.so.0" "$prefix/lib/libxccl.so"
cp "$target/libxccl.a" "$prefix/lib/libxccl.a"
cp "$here/include/xccl.h" "$prefix/include/xccl.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" -e "s|@NATIVE_LIBS@|$native|" \
  "$here/xccl.pc.in" > "$prefix/lib/pkgconfig/xccl.pc"
echo "installed xccl $version ($profile) in $prefix"
