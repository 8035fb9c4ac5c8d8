"""Run tinygrad's operator tests (test/backend/test_ops.py) against tgrad through the import shim.

    python tests/tinygrad_shim/run.py /path/to/tinygrad/test/backend/test_ops.py [--device NUMPY]
        [--jobs 2] [--timeout 120] [-k substring] [--forward-only] [--json results.json]

Get the test file from tinygrad's repository (MIT licensed; not vendored here):
    git clone https://github.com/tinygrad/tinygrad && git -C tinygrad checkout v0.14.0
and pass tinygrad/test/backend/test_ops.py.

Each test case runs in a worker process whose sys.path starts with this folder, so `import tinygrad`
finds the shim (tgrad under tinygrad's names); the worker refuses to run if the real tinygrad package
would be imported instead. The summary counts passed / failed / errored / skipped cases and groups the
failures by reason (a missing Tensor method, an assertion, ...).

tgrad's default integer dtype is int64 like PyTorch's; tinygrad's is int32. A case that fails and then
passes when rerun with tgrad's default integer set to int32 (TGRAD_SHIM_DEFAULT_INT=int32, read by the
shim) differs only by that: it is counted as passing ("int64 only").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

WORKER = r"""
import importlib.util, json, os, signal, sys, traceback, unittest
sys.path[:0] = [{shim!r}, {repo!r}]
import tinygrad
if not tinygrad.__file__.startswith({shim!r}):
    sys.exit("the real tinygrad was imported instead of the shim: " + tinygrad.__file__)
spec = importlib.util.spec_from_file_location("tinygrad_test_ops", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
names = json.loads(sys.stdin.read())
loader = unittest.TestLoader()

class Timeout(Exception):
    pass

def alarm(*_):
    raise Timeout("timed out after {timeout} s")

signal.signal(signal.SIGALRM, alarm)
for name in names:
    case = loader.loadTestsFromName(name, module)
    result = unittest.TestResult()
    signal.alarm({timeout})
    try:
        case.run(result)
    except Timeout as e:
        result.errors.append((case, "Timeout: " + str(e)))
    finally:
        signal.alarm(0)
    if result.failures or result.errors:
        kind = "fail" if result.failures else "error"
        text = (result.failures or result.errors)[0][1]
    elif result.skipped:
        kind, text = "skip", result.skipped[0][1]
    else:
        kind, text = "pass", ""
    print(json.dumps({{"name": name, "kind": kind, "text": text[-3000:]}}), flush=True)
"""


def test_names(path: Path) -> list[str]:
    """Test ids (Class.method) in file order, read from the source (no import needed)."""
    names, cls = [], None
    for line in path.read_text().splitlines():
        m = re.match(r"class (\w+)\(", line)
        if m:
            cls = m.group(1)
        m = re.match(r"  def (test_\w+)\(", line)
        if m and cls:
            names.append(f"{cls}.{m.group(1)}")
    return names


def run_workers(path: Path, names: list[str], jobs: int, timeout: int, env: dict) -> dict[str, dict]:
    """Run the named cases in `jobs` worker processes; returns name -> {kind, text}."""
    code = WORKER.format(shim=str(HERE), repo=str(REPO), path=str(path), timeout=timeout)
    procs = []
    for j in range(jobs):
        share = names[j::jobs]
        p = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=str(path.parent),
        )
        p.stdin.write(json.dumps(share))
        p.stdin.close()
        procs.append((p, share))
    results: dict[str, dict] = {}
    for p, share in procs:
        for line in p.stdout:
            if line.startswith("{"):
                r = json.loads(line)
                results[r["name"]] = r
        p.wait()
        for name in share:  # a worker that crashed (segfault, exit) loses the rest of its share
            results.setdefault(name, {"name": name, "kind": "error", "text": f"worker exited {p.returncode}"})
    return results


def reason(text: str) -> str:
    """One line saying why a case failed, with numbers blanked so equal causes group together."""
    lines = [ln for ln in text.strip().splitlines() if re.match(r"[\w.]*(Error|Exception|Timeout)\b", ln)]
    last = lines[-1] if lines else (text.strip().splitlines() or ["?"])[-1]
    m = re.search(
        r"'Tensor' object has no attribute '(\w+)'|type object 'Tensor' has no attribute '(\w+)'", text
    )
    if m:
        return f"missing Tensor.{m.group(1) or m.group(2)}"
    m = re.search(r"(?:type object|module) '([\w.]+)' has no attribute '(\w+)'", text)
    if m:
        return f"missing {m.group(1)}.{m.group(2)}"
    m = re.search(r"got an unexpected keyword argument '(\w+)'", text)
    if m:
        fn = re.search(r"(\w+)\(\) got an unexpected", text)
        return f"unexpected keyword {m.group(1)!r} in {fn.group(1) if fn else '?'}"
    if "dtype mismatch" in text:
        m = re.search(r"dtype mismatch: tinygrad=(\w+) \| torch=(\w+)", text)
        return f"dtype mismatch {m.group(1)} vs torch {m.group(2)}" if m else "dtype mismatch"
    if "shape mismatch" in text:
        return "shape mismatch"
    if "Not equal to tolerance" in text or "Arrays are not equal" in text:
        which = re.search(r"Exception: (forward pass|backward pass)", text)
        return f"wrong values ({which.group(1) if which else '?'})"
    return re.sub(r"\d+", "N", last)[:140]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_file", type=Path, help="tinygrad's test/backend/test_ops.py")
    ap.add_argument("--device", default="NUMPY", help="tgrad device the cases run on (default NUMPY)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per case")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("--forward-only", action="store_true", help="FORWARD_ONLY=1: skip the gradient checks")
    ap.add_argument("--json", type=Path, help="write every case's result here")
    ap.add_argument("--show", type=int, default=0, help="print the traceback tail of this many failures")
    args = ap.parse_args()
    path = args.test_file.resolve()
    names = [n for n in test_names(path) if args.k in n]
    env = {**os.environ, "DEVICE": args.device, "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}"}
    env.pop("DEBUG", None)
    if args.forward_only:
        env["FORWARD_ONLY"] = "1"
    t0 = time.time()
    results = run_workers(path, names, args.jobs, args.timeout, env)
    failed = [n for n in names if results[n]["kind"] in ("fail", "error")]
    if failed:  # the int64 rule: rerun with int32 as the default integer
        again = run_workers(path, failed, args.jobs, args.timeout, {**env, "TGRAD_SHIM_DEFAULT_INT": "int32"})
        for n in failed:
            if again[n]["kind"] == "pass":
                results[n] = {**results[n], "kind": "pass_int64", "text": results[n]["text"]}
    counts = collections.Counter(results[n]["kind"] for n in names)
    passed = counts["pass"] + counts["pass_int64"]
    ran = len(names) - counts["skip"]
    print(
        f"{len(names)} cases on {args.device}{' (forward only)' if args.forward_only else ''} "
        f"in {time.time() - t0:.0f} s: {passed} pass ({counts['pass_int64']} of them only with int32 as "
        f"the default int), {counts['fail']} fail, {counts['error']} error, {counts['skip']} skipped; "
        f"pass rate {passed / max(ran, 1):.1%} of {ran} run"
    )
    reasons = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    for n in names:
        if results[n]["kind"] in ("fail", "error"):
            r = reason(results[n]["text"])
            reasons[r] += 1
            examples[r].append(n.split(".")[-1])
    print("\nfailures by reason:")
    for r, c in reasons.most_common():
        shown = ", ".join(examples[r][:4]) + (", ..." if c > 4 else "")
        print(f"  {c:4d}  {r}   [{shown}]")
    for n in [n for n in names if results[n]["kind"] in ("fail", "error")][: args.show]:
        print(f"\n=== {n}\n{results[n]['text'][-1500:]}")
    if args.json:
        args.json.write_text(json.dumps([results[n] for n in names], indent=1))


if __name__ == "__main__":
    main()
