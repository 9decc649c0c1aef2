#!/usr/bin/env bash
# Two hosts as users run them, on one 4-GPU machine: two kiln-run "nodes" of two GPUs each
# (CUDA_VISIBLE_DEVICES 0,1 and 2,3), NCCL forced onto sockets (no P2P, no shared memory), the
# store on a Redis server. Runs tests/dist_worker's DDP and fully_shard GPT scenarios (each rank
# checks itself against one process), then kills node 1's rank 3 mid-run: node 0's ranks must
# end in kiln::Error naming it. Prints one line per case.
#   tests/two_nodes.sh BUILD_DIR [nccl|gloo]   (redis-server on PATH or in BUILD_DIR/bin; gloo: the
#   same on the CPU, a check of this script without GPUs)
set -uo pipefail
build=$1 backend=${2:-nccl}
redis=$(command -v redis-server || echo "$build/bin/redis-server")
rport=$((21000 + RANDOM % 20000))
"$redis" --port "$rport" --save '' --appendonly no --daemonize yes --pidfile "/tmp/kiln-redis-$rport.pid" >/dev/null
sleep 0.5
trap 'kill $(cat /tmp/kiln-redis-$rport.pid) 2>/dev/null' EXIT
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 KILN_TEST_BACKEND=$backend
[ "$backend" = nccl ] && export KILN_TEST_DEVICE=cuda
export KILN_TEST_INIT_METHOD=redis://127.0.0.1:$rport KILN_TEST_TIMEOUT_MS=30000
node() {  # node rank, gpus, scenario, extra env...
  local k=$1 gpus=$2 scenario=$3; shift 3
  env CUDA_VISIBLE_DEVICES=$gpus KILN_RUN_ID=two-nodes-$scenario-$rport "$@" "$build/examples/kiln-run" --nnodes 2 \
    --node-rank "$k" --master-addr 127.0.0.1 --master-port $((rport + 1)) --nproc 2 \
    $([ "$scenario" = x ] && echo "$build/tests/dist_fault_worker rank_exits" || echo "$build/tests/dist_worker $scenario")
}
for scenario in ddp_gpt dtensor_gpt; do
  for mode in eager compiled; do
    [ "$scenario" = dtensor_gpt ] && [ "$mode" = compiled ] && continue
    t0=$(date +%s.%N)
    node 0 0,1 "$scenario" KILN_TEST_DDP_MODE=$mode >/tmp/node0.log 2>&1 &
    p0=$!
    node 1 2,3 "$scenario" KILN_TEST_DDP_MODE=$mode >/tmp/node1.log 2>&1
    r1=$?
    wait $p0
    r0=$?
    t1=$(date +%s.%N)
    echo "two nodes, $scenario $mode: node 0 status $r0, node 1 status $r1 ($(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s): $(grep -h -E 'equal|FAIL' /tmp/node0.log /tmp/node1.log | sort -u | tr '\n' ' ' | cut -c1-400)"
  done
done
# Node 1 dies: both its ranks (2 and 3) are killed (kill -9) in the backward of a DDP step.
t0=$(date +%s.%N)
node 0 0,1 x KILN_TEST_DEATH=kill KILN_TEST_WHEN=ddp KILN_TEST_DYING=2,3 >/tmp/node0.log 2>&1 &
p0=$!
node 1 2,3 x KILN_TEST_DEATH=kill KILN_TEST_WHEN=ddp KILN_TEST_DYING=2,3 >/tmp/node1.log 2>&1
r1=$?
wait $p0
r0=$?
t1=$(date +%s.%N)
echo "node 1 killed in a DDP step: node 0 status $r0, node 1 status $r1 ($(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f", b - a}') s): $(grep -h -m2 -E 'error after|FAIL' /tmp/node0.log | cut -c1-300 | tr '\n' ' ')"
