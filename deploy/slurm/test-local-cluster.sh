#!/usr/bin/env bash
# The Slurm deployment, tested on a one-node cluster started here (no systemd): munged with
# its socket in a private world-executable directory, slurmctld and slurmd as root with
# proctrack/linuxproc and task/none. Submits a 4-shard array of a tiny dataset and the merge
# (deploy/slurm/submit.sh), waits by polling squeue, checks that the merged set has the same
# tasks and as many records as one machine's run, and stops the daemons.
#
# Needs: Debian's slurm-wlm and munge (.ci/run installs them), root, a built xtask.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
xtask="${TESSEL_XTASK:-$repo/target/release/xtask}"
[ -x "$xtask" ] || { echo "no xtask at $xtask: cargo build --release -p xtask" >&2; exit 1; }
for cmd in munged slurmctld slurmd sbatch squeue scontrol sinfo; do
  command -v "$cmd" >/dev/null || { echo "$cmd not found: apt-get install slurm-wlm munge" >&2; exit 1; }
done

work="$(mktemp -d /tmp/tessel-slurm.XXXXXX)"
chmod 755 "$work"
conf="$work/slurm.conf"
stop() {
  set +e
  [ -f "$conf" ] && SLURM_CONF="$conf" scontrol shutdown >/dev/null 2>&1
  for pid in "$work"/slurmd.pid "$work"/slurmctld.pid "$work"/munge/munged.pid; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null
  done
  sleep 1
  for pid in "$work"/slurmd.pid "$work"/slurmctld.pid "$work"/munge/munged.pid; do
    [ -f "$pid" ] && kill -9 "$(cat "$pid")" 2>/dev/null
  done
}
fail() {
  echo "slurm test: $*" >&2
  for log in "$work"/*.log "$work"/munge/*.log "$work"/out/*.out; do
    [ -f "$log" ] && { echo "--- $log" >&2; tail -n 20 "$log" >&2; }
  done
  exit 1
}
trap stop EXIT

# munge: a fresh key, its socket where every user can reach it.
mkdir -p "$work/munge"
chmod 755 "$work/munge"
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
munged --force --socket="$work/munge/munge.socket.2" --key-file="$work/munge/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/munge/munged.log" \
  --seed-file="$work/munge/munged.seed" || fail "munged did not start"

node="$(hostname -s)"
cpus="$(nproc)"
mkdir -p "$work/state" "$work/spool" "$work/out"
cat > "$conf" <<CONF
ClusterName=tessel-ci
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$work/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
SlurmctldPort=${TESSEL_SLURMCTLD_PORT:-16817}
SlurmdPort=${TESSEL_SLURMD_PORT:-16818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$conf"
slurmctld -f "$conf" || fail "slurmctld did not start"
slurmd -f "$conf" || fail "slurmd did not start"
for _ in $(seq 60); do
  state="$(sinfo -h -N -o %T 2>/dev/null || true)"
  case "$state" in idle*|mixed*|allocated*) break;; esac
  sleep 0.5
done
case "$state" in idle*|mixed*|allocated*) ;; *) fail "the node did not come up (state '$state')";; esac
echo "slurm test: one-node cluster up on $node ($cpus CPUs)"

# A tiny dataset: BERT-tiny's 5 tasks, 3 schedules each, on the compiler-vectorized
# fallback (every x86 machine has it).
args=(--network bert-tiny-128 --platform scalar --per-task 3 --seed 7)
ids="$(TESSEL_XTASK="$xtask" "$repo/deploy/slurm/submit.sh" 4 "$work/out" "$work/merged.jsonl" -- "${args[@]}")" \
  || fail "submit failed"
echo "slurm test: submitted array and merge: $ids"
for _ in $(seq 600); do
  [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
  sleep 0.5
done
[ -z "$(squeue -h -o %i)" ] || fail "jobs still queued after 5 minutes: $(squeue -h)"
[ -f "$work/merged.jsonl" ] || fail "no merged file (a shard or the merge failed)"

# The same dataset on one machine.
"$xtask" dataset "${args[@]}" --out "$work/single.jsonl" >/dev/null 2>&1 || fail "the one-machine run failed"
tasks() { grep -o '"workload":"[^"]*"' "$1" | sort -u; }
records() { wc -l < "$1" | tr -d ' '; }
[ "$(tasks "$work/merged.jsonl")" = "$(tasks "$work/single.jsonl")" ] \
  || fail "merged tasks differ from one machine's: $(diff <(tasks "$work/merged.jsonl") <(tasks "$work/single.jsonl"))"
[ "$(records "$work/merged.jsonl")" = "$(records "$work/single.jsonl")" ] \
  || fail "merged has $(records "$work/merged.jsonl") records, one machine $(records "$work/single.jsonl")"
# Every shard did part of the work, and no task was measured by two shards.
for i in 0 1 2 3; do
  [ -s "$work/out/shard-$i-of-4.jsonl" ] || fail "shard $i wrote nothing"
done
dup="$(for i in 0 1 2 3; do tasks "$work/out/shard-$i-of-4.jsonl"; done | sort | uniq -d)"
[ -z "$dup" ] || fail "tasks measured by two shards: $dup"
echo "slurm test: ok: $(records "$work/merged.jsonl") records of $(tasks "$work/merged.jsonl" | wc -l) tasks from 4 shards equal one machine's run"
trap - EXIT
stop
rm -rf "$work"
