#!/bin/sh
# xrun-launch: xrun's part of the user's container, for ANY image with a POSIX /bin/sh (dash,
# bash, busybox ash): no python, no xrun module. xrun's init container copies this file into
# the pod's shared folder; the manifest runs it as
#     /bin/sh "$XRUN_POD_DIR/bin/xrun-launch" 'the user command'
# What it does (why: README "Any image"):
#   * exports XRUN_PROCESS_ID = slice index x hosts per slice + host index (Kubernetes cannot
#     compute it) and PYTHONUNBUFFERED=1 unless set (a Python child flushes every line);
#   * on GPU stacks with an NCCL plugin env file (XRUN_NCCL_ENV_PROFILE) sources it, or exports
#     the fallback lines (XRUN_NCCL_ENV_FALLBACK) without it; the run file's env (XRUN_USER_ENV)
#     keeps its values;
#   * runs the command as `/bin/sh -c COMMAND` with stdout and stderr appended straight to
#     $XRUN_POD_DIR/output.log: each write lands in the file (an emptyDir) at once, with no
#     pipe in between, so a SIGKILL of any process loses no line that was written; xrun's
#     log-shipping sidecar ships the file to storage, and after this container ends;
#   * copies the file to its own stdout (kubectl logs) with `tail -f` when the image has tail
#     and wc (GNU tail follows this shell's pid: it never outlives it); its own lines go to
#     stdout directly, as JSON with XRUN_LOG_FORMAT=json;
#   * forwards SIGTERM/SIGINT to every process of its process group (the container: the
#     runtime starts PID 1 as a session leader; the local backend starts each pod with
#     setsid), so a pipeline's python gets it too; a signal before the command started means
#     it never starts (exit 143: the command's shell checks a file the forward writes, on a
#     line before the user's command);
#   * prints the start, end and EXIT_CODE lines (xrun_contract WRAPPER_*_LINE, EXIT_CODE_LINE)
#     and exits with the command's code (128+N for a signal) - the pod's exit code, which the
#     Job's podFailurePolicy reads - once the log shipper takes SIGTERM (shipper.ready);
#   * an exit 1 right after JAX's "Terminating process because the JAX distributed service
#     detected fatal errors" (native QFATAL: a peer died) exits $XRUN_RESTARTABLE_EXIT_CODE
#     instead (workload/failures.py classify_output; needs grep in the image).
cmd=${1:?usage: xrun-launch COMMAND}
dir=${XRUN_POD_DIR:?XRUN_POD_DIR is not set}
out="$dir/output.log"
slice=${XRUN_SLICE_INDEX:-0}
host=${XRUN_HOST_INDEX:-0}
# A resumed run (xrun submit --resume) counts on from its earlier attempts: the JobSet's
# restart attempt starts at 0 again, XRUN_ATTEMPT_BASE says how many came before.
attempt=$(( ${XRUN_RESTART_ATTEMPT:-0} + ${XRUN_ATTEMPT_BASE:-0} ))
XRUN_RESTART_ATTEMPT=$attempt
export XRUN_RESTART_ATTEMPT
unset XRUN_ATTEMPT_BASE
XRUN_PROCESS_ID=$((slice * ${XRUN_HOSTS_PER_SLICE:-1} + host))
export XRUN_PROCESS_ID
: "${PYTHONUNBUFFERED:=1}"
export PYTHONUNBUFFERED

# JSON string of $1 (for the start line's argv): backslash, quote and control characters.
# A string without any is printed as is, and only a control character costs a subshell:
# a fork per character delayed the user's command by a few tenths of a second.
json() {
  case $1 in
    *[\\\"]* | *[[:cntrl:]]*) ;;
    *) printf '"%s"' "$1"; return ;;
  esac
  s=$1 r=
  while [ -n "$s" ]; do
    rest=${s#?}
    c=${s%"$rest"}
    s=$rest
    case $c in
      \\) r="$r\\\\" ;;
      \") r="$r\\\"" ;;
      [[:cntrl:]])
        n=$(printf '%d' "'$c" 2>/dev/null || echo 32)
        if [ "$n" -lt 32 ] 2>/dev/null; then r="$r$(printf '\\u%04x' "$n")"; else r="$r$c"; fi ;;
      *) r="$r$c" ;;
    esac
  done
  printf '"%s"' "$r"
}

# Centiseconds since boot from /proc/uptime (Linux; no date +%N in POSIX).
now() {
  if read -r up _ </proc/uptime 2>/dev/null; then
    echo $(( ${up%.*} * 100 + 1${up#*.} - 100 ))
  else
    echo 0
  fi
}

# This shell's parent now, from /proc (without it: $PPID, the parent it started with).
parent() {
  line=
  if read -r line </proc/$$/stat 2>/dev/null; then
    set -- ${line##*) }  # after "pid (comm) ": state ppid ...
    echo "$2"
  else
    echo "$PPID"
  fi
}

# Is a process other than this shell and its tail still in this shell's process group?
# (/proc, where there is one; without it, no.)
group_busy() {
  [ -r /proc/self/stat ] || return 1
  for stat in /proc/[0-9]*/stat; do
    p=${stat#/proc/}
    p=${p%/stat}
    if [ "$p" = "$$" ] || [ "$p" = "$echo_pid" ]; then continue; fi
    line=
    read -r line <"$stat" 2>/dev/null || continue
    set -- ${line##*) }  # after "pid (comm) ": state ppid pgrp ...
    if [ "$1" != Z ] && [ "$3" = "$$" ]; then return 0; fi
  done
  return 1
}

# Signals first. A SIGTERM can come while this shell is still starting (the local backend's
# supervisor dying right after it started the pod): before this trap it killed the shell,
# leaving `tail -f` (it ignores TERM) running for ever, or it came before the command
# started, which then ran unsignalled. Now it is forwarded, and the command never starts.
# A forwarded signal can also be lost: a child forked just before it keeps this shell's
# handler until it execs, and the exec forgets the caught signal (1 local-backend run in
# 25-60 went on running its command after its supervisor was killed). So the signal is
# first written down ($stopped), and the command's shell reads that before running it.
forwarded=
stopped="$dir/launch.stopped"
forward() {
  [ -n "$forwarded" ] && return
  forwarded=1
  : >"$stopped" 2>/dev/null
  trap '' TERM INT  # the group signal below reaches this shell too
  kill -TERM 0 2>/dev/null
}
trap forward TERM INT

mkdir -p "$dir" || exit 127
rm -f "$stopped"  # left by an earlier start of this container (an emptyDir outlives it)
# xrun's own lines: plain into the file (storage); on stdout plain, or one JSON object per line
# with XRUN_LOG_FORMAT=json (Cloud Logging reads "severity"). The user's lines stay as written.
emit() {
  printf '%s\n' "$1" >>"$out"
  if [ "${XRUN_LOG_FORMAT:-}" = json ]; then
    printf '{"severity": "%s", "message": %s, "host": "%s-%s", "attempt": %d}\n' "$2" "$(json "$1")" \
      "$slice" "$host" "$attempt"
  else
    printf '%s\n' "$1"
  fi
}
emit "$(printf 'xrun-wrapper: start host=%s-%s attempt=%s argv=[%s, %s, %s]' "$slice" "$host" \
  "$attempt" '"/bin/sh"' '"-c"' "$(json "$cmd")")" INFO

# GPU networking stacks (manifests/accelerators.yaml env_profile): the NCCL plugin on the node
# ships the env its release needs (GKE TCPXO: nccl-env-profile.sh, whose guest config checker
# aborts a workload without it; gIB: set_nccl_env.sh). Source it, so the env always matches the
# installed plugin, then give the run file's own env (XRUN_USER_ENV names) its values back.
# Without the file (or one this shell cannot read), export xrun's fallback lines instead.
nccl_env() {
  profile=${XRUN_NCCL_ENV_PROFILE:-}
  [ -n "$profile" ] || return 0
  if [ -f "$profile" ] && ( . "$profile" ) >/dev/null 2>&1; then
    for name in ${XRUN_USER_ENV:-}; do eval "xrun_keep_$name=\${$name-}"; done
    . "$profile" >>"$out" 2>&1
    for name in ${XRUN_USER_ENV:-}; do eval "$name=\$xrun_keep_$name; export $name"; done
    emit "xrun-wrapper: nccl env from $profile" INFO
    return 0
  fi
  why="no $profile"
  [ -f "$profile" ] && why="$profile failed in /bin/sh"
  while IFS= read -r kv; do
    name=${kv%%=*}
    [ -n "$kv" ] && [ "$name" != "$kv" ] || continue
    case " ${XRUN_USER_ENV:-} " in *" $name "*) continue ;; esac
    export "$kv"
  done <<XRUN_EOF
${XRUN_NCCL_ENV_FALLBACK:-}
XRUN_EOF
  emit "xrun-wrapper: nccl env: $why; xrun's fallback values (accelerators.yaml env_fallback)" WARNING
}
nccl_env

# workdir (issue #30): the shipped tree the init container unpacked is the command's cwd and
# first on PYTHONPATH, so `python3 train.py` and `import mypkg` find the user's code.
if [ -n "${XRUN_WORKDIR:-}" ]; then
  cd "$XRUN_WORKDIR" || { emit "xrun failure: user: workdir $XRUN_WORKDIR is missing; exit code 126" ERROR; exit 126; }
  PYTHONPATH="$XRUN_WORKDIR${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
fi
start=$(now)

# kubectl logs: the user's output, from the file, from after the start line on. With GNU
# tail's --pid it also ends when this shell does, however this shell ends (even SIGKILL).
echo_pid=
if command -v tail >/dev/null 2>&1 && command -v wc >/dev/null 2>&1; then
  from=$(($(wc -c <"$out") + 1))
  follow=
  if tail --pid=$$ -c 0 /dev/null >/dev/null 2>&1; then follow="--pid=$$"; fi
  (trap '' TERM INT; exec tail $follow -c "+$from" -f "$out") &
  echo_pid=$!
else
  echo "xrun-launch: no tail in this image; the output is in storage only (xrun logs)" >&2
fi

code=143  # 128 + SIGTERM: stopped before the command started
if [ -z "$forwarded" ]; then
  # The check on its own line: forwarded after the test above, the signal may have missed
  # the command's shell (or found TERM ignored in it, inherited from forward()).
  XRUN_LAUNCH_STOPPED=$stopped /bin/sh -c "[ ! -e \"\$XRUN_LAUNCH_STOPPED\" ] || exit 143
$cmd" </dev/null >>"$out" 2>&1 &
  child=$!
  while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || break  # wait was interrupted by a trapped signal
  done
  # Stopped: the command's shell may die of the SIGTERM while its program (JAX's preemption
  # notifier catches SIGTERM) still saves a checkpoint. This shell is the container's first
  # process, and the container ends with it: wait for the rest of the process group
  # first, so the save gets the grace period (whose end is a SIGKILL of the whole group).
  if [ -n "$forwarded" ]; then
    while group_busy; do sleep 0.2 2>/dev/null || sleep 1; done
  fi
fi

if [ -n "$echo_pid" ]; then
  sleep 1  # let tail print the last lines (busybox tail polls once a second)
  kill -KILL "$echo_pid" 2>/dev/null
  wait "$echo_pid" 2>/dev/null
fi
if [ "$code" -eq 127 ]; then
  # The shell found no such program: a typo is not a preemption. 127 is in the default
  # restartable set (127-255), so it would crash-loop; xrun_contract
  # COMMAND_NOT_FOUND_EXIT_CODE (126) is outside it and fails the JobSet at once.
  emit "xrun failure: user: command not found (shell exit 127); exit code 126" ERROR
  code=126
fi
severity=INFO
[ "$code" -eq 0 ] || severity=ERROR
if [ "$code" -eq 1 ] && command -v grep >/dev/null 2>&1 && grep -qF \
    "Terminating process because the JAX distributed service detected fatal errors" "$out"; then
  code=${XRUN_RESTARTABLE_EXIT_CODE:-42}
  emit "xrun failure: infrastructure: JAX distributed service detected fatal errors (a peer or the coordinator died); exit code $code" ERROR
fi
end=$(now)
secs=$((end - start))
emit "$(printf 'xrun-wrapper: end host=%s-%s exit_code=%s seconds=%d.%02d' "$slice" "$host" "$code" \
  $((secs / 100)) $((secs % 100)))" "$severity"
emit "EXIT_CODE=$code" "$severity"
# The log shipper (the xrun-logs sidecar) gets SIGTERM as soon as this container ends, and
# the kubelet started this container once the shipper's process ran, not once it could take
# the signal: a command shorter than python's start (an echo) killed the shipper before it
# shipped a line, and the host's whole log was lost. It writes shipper.ready once SIGTERM
# waits for its drain (xrun_contract PodFiles.SHIPPER_READY): wait for that, at most 20 s.
# Not when the process that started this shell is gone (the local backend's supervisor,
# killed): the kernel signalled the shipper at the same moment (PR_SET_PDEATHSIG), so it is
# draining or dead, and waiting only kept this pod 20 s past its supervisor. In a container
# this shell's parent never changes (PID 1's is 0).
n=0
[ -n "$forwarded" ] && [ "$(parent)" != "$PPID" ] && n=200
while [ ! -e "$dir/shipper.ready" ] && [ "$n" -lt 200 ]; do
  if sleep 0.1 2>/dev/null; then n=$((n + 1)); else sleep 1; n=$((n + 10)); fi
done
exit "$code"
