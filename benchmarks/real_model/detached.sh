#!/usr/bin/env bash
# A run longer than one 10-minute device call, as a job of benchmarks/gpu_queue.py:
#   NAME GPUS sh: bash benchmarks/real_model/detached.sh NAME COMMAND...
# starts COMMAND once, in a process session of its own (so the end of the call does not kill it: the device's
# README), output in $W/NAME.run.log, and waits for it; the queue's deadline stops the wait, not the run, and the
# same job in the next call on the warm machine waits again (holding its GPUs) until the run's exit status is in
# $W/NAME.rc, which it returns.
set -u
name=${1:?NAME COMMAND...}; shift
if [ ! -f "$W/$name.launched" ]; then
  date -u +%FT%TZ > "$W/$name.launched"
  setsid bash -c "$*"' ; echo $? > "$0"' "$W/$name.rc" > "$W/$name.run.log" 2>&1 < /dev/null &
fi
while [ ! -f "$W/$name.rc" ]; do sleep 5; done
exit "$(cat "$W/$name.rc")"
