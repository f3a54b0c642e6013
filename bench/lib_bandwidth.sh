# lib_bandwidth.sh -- sourced by the CPU benchmark scripts (cpu_decode.sh, v4_decode.sh).
#
# measure_bandwidth: bench_matmul prints the measured read bandwidth ("... <number> GB/s")
# before its matmul timings; this takes the first such line and stops the program there.
# Its arguments are `[threads]`; a --bandwidth-only flag is passed if the binary knows one.
# BENCH_MATMUL_ARGS replaces both. Needs BENCH_MATMUL, THREADS, RAW (log folder) and a
# `note` function from the caller; prints the GB/s figure.
measure_bandwidth() {
    local args
    if [ -n "${BENCH_MATMUL_ARGS:-}" ]; then
        read -r -a args <<< "$BENCH_MATMUL_ARGS"
    elif grep -q -a -- "--bandwidth-only" "$BENCH_MATMUL"; then
        args=(--bandwidth-only "$THREADS")
    else
        args=("$THREADS")
    fi
    note "$BENCH_MATMUL ${args[*]} (until it prints the read bandwidth)"
    python3 - "$RAW/bench_matmul.txt" "$BENCH_MATMUL" "${args[@]}" << 'PY'
import re, shutil, subprocess, sys
log = open(sys.argv[1], "w")
cmd = sys.argv[2:]
if shutil.which("stdbuf"):           # line-buffer its stdout, so the first line comes at once
    cmd = ["stdbuf", "-oL"] + cmd
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
for line in p.stdout:
    log.write(line)
    m = re.search(r"([0-9]+(?:\.[0-9]+)?)\s*GB/s", line)
    if m:
        p.terminate()
        p.wait()
        print(m.group(1))
        sys.exit(0)
p.wait()
sys.exit("no '<number> GB/s' in the output of %s (exit %s), see %s" % (sys.argv[2], p.returncode, sys.argv[1]))
PY
}
