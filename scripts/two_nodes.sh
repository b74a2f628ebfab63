# Sourced by the scripts that run the main job on 2 "nodes" of 2 ranks: two zerorun launchers on
# localhost, as docs/launcher.md runs several nodes. Needs B (the opt binaries' folder) and OUT.
#   run_two_nodes NAME ARGS...   -> $OUT/NAME.node0.log and $OUT/NAME.node1.log
two_nodes_port=$((29300 + RANDOM % 600))
run_two_nodes() {
  local name=$1 node
  shift
  two_nodes_port=$((two_nodes_port + 1))
  ZERO_JOB_TOKEN=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  export ZERO_JOB_TOKEN  # the two launchers' shared secret (docs/launcher.md)
  for node in 0 1; do
    "$B/comm/launch/zerorun" --nnodes 2 --node-rank "$node" --master-addr 127.0.0.1 --master-port "$two_nodes_port" \
      --nproc-per-node 2 -- "$B/examples/gpt/train_gpt" "$@" >"$OUT/$name.node$node.log" 2>&1 &
  done
  wait
}
