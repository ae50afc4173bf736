#!/usr/bin/env bash
# The per-sink table of BENCHMARKS.md, in one sitting: for each sink, a drain
# of 500,000 unkeyed 200-byte messages by one relay (Open Outbox Relay's
# shape) and a sweep for the highest sustainable rate in the Namastack shape
# (10 records per key, producer batch 100), then the brokers' direct-publish
# baselines with the same clients (go test -bench DirectPublish).
# usage: scripts/sink-bench.sh DATABASE_URL OUTDIR [sink...]
# sinks: null kafka nats amqp redis webhook-batch webhook-single (default: all)
# Needs the machine's NATS (4222), RabbitMQ (5672) and Redis (6379); Kafka is
# kfake served by scripts/benchbrokers, the webhook receiver too. Redis runs
# with appendonly yes (appendfsync everysec) for its runs, as the peers'
# figures were taken, and is set back afterwards.
set -euo pipefail
url=$1 out=$2; shift 2
sinks=("$@")
[ ${#sinks[@]} -gt 0 ] || sinks=(null kafka nats amqp redis webhook-batch webhook-single)
mkdir -p "$out"
bin=${WHARF_BIN:-$out/wharf}
[ -x "$bin" ] || go build -o "$bin" ./cmd/wharf
tool=$out/benchbrokers
[ -x "$tool" ] || go build -o "$tool" ./scripts/benchbrokers
common=(--database-url "$url" --producers 4 --producer-batch 100 --payload-bytes 200)
nats=nats://127.0.0.1:4222 amqp=amqp://guest:guest@127.0.0.1:5672/
bg=

start_bg() { "$@" & bg=$!; sleep 1; }
stop_bg() { [ -z "$bg" ] || { kill "$bg"; wait "$bg" 2>/dev/null || true; bg=; }; }
trap 'stop_bg; redis-cli config set appendonly "${aof_before:-no}" >/dev/null 2>&1 || true' EXIT

serve() { # sink: start its destination server, if it needs one (not in a subshell: stop_bg needs the pid)
  case $1 in
    kafka) start_bg "$tool" kafka 127.0.0.1:19092 bench ;;
    webhook-*) start_bg "$tool" http 127.0.0.1:18080 ;;
  esac
}
setup() { # sink -> prints the sink URL
  case $1 in
    null) echo "null:" ;;
    kafka) echo "kafka://127.0.0.1:19092" ;;
    nats) "$tool" nats-delete $nats WHARFBENCH 2>/dev/null || true
          "$tool" nats-stream $nats WHARFBENCH 'wbench.>'
          echo "$nats?stream=WHARFBENCH&subject_template=wbench.{{topic}}" ;;
    amqp) "$tool" amqp-delete $amqp wharf-bench 2>/dev/null || true
          "$tool" amqp-queue $amqp wharf-bench
          echo "$amqp?routing_key_template=wharf-bench" ;;
    redis) redis-cli del wharfbench:bench >/dev/null
           echo "redis://127.0.0.1:6379/0?stream_template=wharfbench:{{topic}}&maxlen=1000000" ;;
    webhook-batch) echo "http://127.0.0.1:18080/hook?wharf_allow_private=true&wharf_mode=batch" ;;
    webhook-single) echo "http://127.0.0.1:18080/hook?wharf_allow_private=true" ;;
    *) echo "unknown sink $1" >&2; exit 2 ;;
  esac
}
teardown() {
  stop_bg
  case $1 in
    nats) "$tool" nats-delete $nats WHARFBENCH ;;
    amqp) "$tool" amqp-delete $amqp wharf-bench ;;
    redis) redis-cli del wharfbench:bench >/dev/null ;;
  esac
}

aof_before=$(redis-cli config get appendonly | tail -n 1)
for s in "${sinks[@]}"; do
  [ "$s" = redis ] && redis-cli config set appendonly yes >/dev/null && redis-cli config set appendfsync everysec >/dev/null
  for shape in drain sweep; do
    serve "$s"
    u=$(setup "$s")
    psql -X -q "$url" -c CHECKPOINT
    echo "== $s $shape: $u" >&2
    if [ $shape = drain ]; then
      "$bin" bench "${common[@]}" --sink "$u" --mode drain --messages 500000 --records-per-key 0 \
        --json "$out/$s-drain.json" 2>/dev/null | tee "$out/$s-drain.txt"
    else
      "$bin" bench "${common[@]}" --sink "$u" --mode sweep --records-per-key 10 --duration 8s --warmup 3s \
        --sweep-steps 5 --min-rate 5000 --max-rate 90000 --json "$out/$s-sweep.json" 2>/dev/null | tee "$out/$s-sweep.txt"
    fi
    teardown "$s"
  done
  [ "$s" = redis ] && redis-cli config set appendonly "$aof_before" >/dev/null
done

# Direct-publish baselines: the brokers' own clients, batches of 1000, confirmed.
redis-cli config set appendonly yes >/dev/null
go test -run '^$' -bench 'Publish' -benchtime 200000x ./wharfkafka/ ./wharfnats/ ./wharfamqp/ ./wharfredis/ ./wharfwebhook/ \
  | tee "$out/direct.txt"
redis-cli config set appendonly "$aof_before" >/dev/null
