#!/usr/bin/env bash
# The Debian 13 stage of CI: ferry built and tested against Debian 13's LibTorch 2.6, g++ 14,
# CMake 3.31 and OpenCV 4.10, inside a Debian 13 root (debootstrap) that is made on first use and
# reused after. The checkout is mounted into the root at /ferry and `./setup.sh test` runs there,
# so the root installs what it needs exactly as a fresh Debian 13 machine would.
#
#   tests/debian13.sh              make or update the root, then ./setup.sh test inside it
#   tests/debian13.sh shell        an interactive shell inside the root, in /ferry
#   tests/debian13.sh run CMD...   CMD inside the root, in /ferry (after ./setup.sh test, the
#                                  build is in $FERRY_BUILD_DIR there)
#
# Each checkout builds into a folder of its own inside the root (/root/ferry-builds/NAME-HASH,
# from the checkout's path), since every checkout is seen at /ferry: two checkouts sharing one
# build would let ninja take the other's newer objects for up to date.
#
# FERRY_DEBIAN13_ROOT    the root's folder (default ~/.cache/ferry/debian13; about 3 GB)
# FERRY_DEBIAN_MIRROR    the Debian mirror (default http://deb.debian.org/debian)
# Needs root (mounts and chroot); installs debootstrap on this machine when it is missing.
set -euo pipefail

cd "$(dirname "$0")/.."
checkout="$(pwd -P)"
build_dir="/root/ferry-builds/$(basename "$checkout")-$(printf %s "$checkout" | sha1sum | cut -c1-10)"
root="${FERRY_DEBIAN13_ROOT:-$HOME/.cache/ferry/debian13}"
mirror="${FERRY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ready_mark="$root/.ferry-root-ready"

if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: $0 needs root (mount, chroot) or sudo" >&2; exit 1; }
  exec sudo --preserve-env=FERRY_DEBIAN13_ROOT,FERRY_DEBIAN_MIRROR,HOME "$0" "$@"
fi

mode="${1:-test}"
case "$mode" in
  test | shell) ;;
  run) shift; [ $# -gt 0 ] || { echo "usage: $0 run CMD..." >&2; exit 2; } ;;
  *) echo "usage: $0 [test|shell|run CMD...]" >&2; exit 2 ;;
esac

# One user of a root at a time: a second run waits for the first.
mkdir -p "$(dirname "$root")"
exec 9>"$root.lock"
flock 9

# Everything mounted under the root, deepest first.
mounted_under_root() {
  findmnt -rn -o TARGET | awk -v r="$root/" 'index($0 "/", r) == 1' | sort -r
}
unmount_all() {
  local target
  while read -r target; do
    [ -n "$target" ] && umount -l "$target" 2>/dev/null || true
  done < <(mounted_under_root)
}
trap unmount_all EXIT
unmount_all  # a run that was killed may have left its mounts

if [ ! -f "$ready_mark" ]; then
  if [ -e "$root" ]; then
    echo "==> removing an unfinished Debian 13 root ($root)"
    [ -z "$(mounted_under_root)" ] || { echo "error: $root still has mounts" >&2; exit 1; }
    rm -rf --one-file-system "$root"
  fi
  if ! command -v debootstrap >/dev/null; then
    echo "==> installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  fi
  echo "==> making a Debian 13 root in $root (debootstrap --variant=minbase trixie)"
  started=$SECONDS
  debootstrap --variant=minbase --include=ca-certificates trixie "$root" "$mirror" \
    >"$root.debootstrap.log" 2>&1 || {
    echo "error: debootstrap failed; the last lines of $root.debootstrap.log:" >&2
    tail -n 20 "$root.debootstrap.log" >&2
    exit 1
  }
  echo "    done in $((SECONDS - started)) s"
  touch "$ready_mark"
fi

# The kernel's file systems, this machine's name resolution, and the checkout at /ferry.
mkdir -p "$root/ferry"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount --bind "$checkout" "$root/ferry"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    FERRY_BUILD_DIR="$build_dir" "$@"
}

case "$mode" in
  test)
    echo "==> Debian 13: ./setup.sh test in $root (build: $build_dir)"
    in_root /bin/bash -c 'cd /ferry && ./setup.sh test'
    ;;
  shell) in_root /bin/bash -c 'cd /ferry && exec bash -i' ;;
  run)
    printf -v cmd '%q ' "$@"
    in_root /bin/bash -c "cd /ferry && $cmd"
    ;;
esac
