#!/usr/bin/env bash
# test_run_steps.sh -- tests/gpu/run.sh with a stand-in attnjit-gpu (a
# script): a check that crashes (SIGSEGV in flash_fwd) is recorded as
# crashed and the later steps still run, each family's JSON lands in
# results.json, and run.sh exits 1.  No GPU needed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bundle"
cp "$here/run.sh" "$tmp/bundle/"
cat > "$tmp/bundle/attnjit-gpu" <<'STANDIN'
#!/usr/bin/env bash
# stand-in: check --family F --out DIR | backward | flash-bwd | ring --out FILE
case $1 in
  check)
    family=$3 out=.
    while [ $# -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
    [ "$family" = flash_fwd ] && kill -SEGV $$
    echo "{\"family\": \"$family\", \"failed\": 0}" > "$out/gpu_check_$family.json"
    echo "stand-in check $family" ;;
  ring) echo '{"ring": {"ok": true}}' > "$3" ;;
  *) echo "stand-in $1" ;;
esac
STANDIN
chmod +x "$tmp/bundle/attnjit-gpu"
OUT=$tmp/out PATH=/usr/bin:/bin timeout 120 "$tmp/bundle/run.sh" > "$tmp/run.log" 2>&1
rc=$?
python3 - "$tmp/out/results.json" "$rc" <<'PY' || { cat "$tmp/run.log"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
steps = {s["step"]: s for s in r["steps"]}
def check(cond, what):
    if not cond:
        print("FAIL:", what, json.dumps(r, indent=1))
        sys.exit(1)
check(int(sys.argv[2]) == 1, "run.sh exits 1 after a crashed step, not " + sys.argv[2])
check(steps["efficient_fwd"]["status"] == "passed", "efficient_fwd passed")
check(steps["efficient_fwd"]["result"] == {"family": "efficient_fwd", "failed": 0},
      "efficient_fwd's JSON is in results.json")
check(steps["flash_fwd"]["status"] == "crashed (signal 11)", "flash_fwd crashed")
check(steps["flash_fwd"]["result"] is None, "a crashed step has no result")
for later in ("wgmma_fwd", "fp8", "paged", "backward", "flash_bwd", "bench", "startup", "dump",
              "flash_bwd_wgmma", "ring"):
    check(steps[later]["status"] == "passed", later + " ran after the crash")
check(steps["ring"]["result"] == {"ring": {"ok": True}}, "ring's JSON is in results.json")
print("ok: %d steps, flash_fwd crashed, the rest ran" % len(steps))
PY
