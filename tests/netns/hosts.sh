# shellcheck shell=bash
# Hosts made of network namespaces on one switch, for scripts that run as root and have checked
# that namespaces are permitted (tests/netns/multihost_test.sh, bench/scaling_netns.sh). Source it
# with $tag set to a prefix unique to the run (e.g. "pt$$"). It defines:
#   work        a temporary directory;
#   pids        the array of processes to kill at exit (append to it);
#   namespaces  the array of namespaces to delete at exit;
#   cleanup     run on EXIT: kills and reaps the pids, deletes the namespaces and $work;
#   switch      the namespace "${tag}sw", holding bridge br0 (made here);
#   add_host NAME ADDRESS
#               adds namespace "${tag}NAME" with one veth to the switch (eth0, ADDRESS/24, up);
#               its loopback stays down.

work=$(mktemp -d)
pids=()
namespaces=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for n in "${namespaces[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

switch="${tag}sw"
ip netns add "$switch"
namespaces+=("$switch")
ip -n "$switch" link add br0 type bridge
ip -n "$switch" link set br0 up

host_index=0
add_host() {
  local ns="${tag}$1" addr=$2
  ip netns add "$ns"
  namespaces+=("$ns")
  local a="${tag}a${host_index}" b="${tag}b${host_index}"
  host_index=$((host_index + 1))
  ip link add "$a" type veth peer name "$b"
  ip link set "$a" netns "$ns"
  ip link set "$b" netns "$switch"
  ip -n "$ns" link set "$a" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$switch" link set "$b" master br0
  ip -n "$switch" link set "$b" up
}
