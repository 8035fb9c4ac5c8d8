"""Run tinygrad's tests against tgrad through the import shim.

    python tests/tinygrad_shim/run.py TEST_FILE... [--device NUMPY] [--jobs 2] [--timeout 120] [-k substr]...
        [--forward-only] [--json results.json] [--show N]
    python tests/tinygrad_shim/run.py --tinygrad /path/to/tinygrad    # the user-facing files (USER_FILES)

vendor/tinygrad_test_ops.py is tinygrad's test_ops.py at a9069c17 (MIT); the user-facing files need a
tinygrad checkout. Each case runs in a worker process whose sys.path starts with this folder, so `import
tinygrad` finds the shim (tgrad under tinygrad's names); the worker refuses to run if the real tinygrad
package would be imported instead.
Cases are listed from the source (test_* methods of TestCase classes, inherited ones included). A case that
tests tinygrad's internals is excluded, mechanically: its source, with the same-file helpers it calls,
mentions one of INTERNAL (UOps, schedules, kernel counts, GlobalCounters, the JIT's captured kernels), not
counting `if DEBUG` lines and skip decorators. The summary counts passed / failed / errored / skipped cases
per file and groups the failures by reason.

tgrad's default integer dtype is int64 like PyTorch's; tinygrad's is int32. A case that fails and then
passes when rerun with tgrad's default integer set to int32 (TGRAD_SHIM_DEFAULT_INT=int32, read by the
shim) differs only by that: it is counted as passing ("int64 only").
"""

from __future__ import annotations

import argparse
import ast
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

# the files of tinygrad's user-facing tests (issue 44), relative to its repository
USER_FILES = [
    "test/backend/test_tensor.py", "test/backend/test_nn.py", "test/backend/test_optim.py",
    "test/backend/test_jit.py", "test/backend/test_dtype.py", "test/backend/test_randomness.py",
    "test/backend/test_symbolic_jit.py", "test/backend/test_symbolic_ops.py", "test/backend/test_setitem.py",
    "test/backend/test_arange.py", "test/backend/test_edgecases.py", "test/unit/test_jit.py",
    "test/unit/test_jit_footguns.py", "test/unit/test_gradient.py", "test/unit/test_dtype_spec.py",
    "test/unit/test_randomness.py", "test/unit/test_indexing.py", "test/unit/test_assign.py",
    "test/unit/test_conv.py", "test/unit/test_linalg.py", "test/unit/test_rearrange_einops.py",
    "test/test_tiny.py", "test/null/test_indexing.py", "test/null/test_tensor.py",
    "test/null/test_rearrange_einops.py",
]

# what marks a case as a test of tinygrad's internals (see the module docstring)
INTERNAL = re.compile(
    r"\b(UOp|Ops\.|KernelInfo|GlobalCounters|kernel_count|assert_kernel_count|check_schedule|schedule\w*|"
    r"assert_jit_cache_len|jit_cache|captured|to_program|run_linear|estimate_uop|compile_linear|graph_class|"
    r"call_is_graph|get_uops|full_rewrite|linearize|lazydata|\.uop\b|KernelCountException|sym_infer|"
    r"allocator|_buffer|ExecItem|\.lowered|BufferSpec|Buffer\b)"
)

SKIP_LINES = r"\bif DEBUG\b|skipIf|skipUnless"  # debug prints and skip conditions do not test internals

WORKER = r"""
import importlib, importlib.util, json, os, signal, sys, time, traceback, unittest
sys.path[:0] = [{shim!r}, {repo!r}]
if {root!r}:  # after the shim (its tinygrad/ is the real one), before the standard library's `test`
    sys.path.insert(2, {root!r})
import tinygrad
if not tinygrad.__file__.startswith({shim!r}):
    sys.exit("the real tinygrad was imported instead of the shim: " + tinygrad.__file__)
if {modname!r}:
    module = importlib.import_module({modname!r})
else:
    spec = importlib.util.spec_from_file_location("tinygrad_test_file", {path!r})
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
    t0 = time.perf_counter()
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
    seconds = round(time.perf_counter() - t0, 2)
    print(json.dumps({{"name": name, "kind": kind, "text": text[-3000:], "s": seconds}}), flush=True)
"""


def test_cases(path: Path) -> list[tuple[str, str | None]]:
    """(Class.method, the INTERNAL name that excludes it or None) for the file's test cases, read from
    the source: test_* methods of classes deriving from TestCase, with those they inherit from classes of
    the same file."""
    src = path.read_text()
    tree = ast.parse(src)
    lines = src.splitlines(keepends=True)  # (ast.get_source_segment splits the whole file on every call)

    def segment(n) -> str:
        if getattr(n, "end_lineno", None) is None:
            return ""
        if n.lineno == n.end_lineno:
            return lines[n.lineno - 1].encode()[n.col_offset : n.end_col_offset].decode()
        first = lines[n.lineno - 1].encode()[n.col_offset :].decode()
        last = lines[n.end_lineno - 1].encode()[: n.end_col_offset].decode()
        return first + "".join(lines[n.lineno : n.end_lineno - 1]) + last

    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def local_bases(c: ast.ClassDef) -> list[str]:
        return [b.id for b in c.bases if isinstance(b, ast.Name) and b.id in classes and b.id != c.name]

    def is_testcase(c: ast.ClassDef) -> bool:
        return any("TestCase" in ast.unparse(b) for b in c.bases) or any(
            is_testcase(classes[b]) for b in local_bases(c))

    def methods(c: ast.ClassDef) -> dict:
        out = {}
        for b in local_bases(c):
            out.update(methods(classes[b]))
        out.update({n.name: n for n in c.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
        return out

    def text(node, ms: dict) -> str:
        """The node's source with that of every same-file function and method it reaches by calls."""
        out, todo, seen = [], [node], {id(node)}
        while todo:
            n = todo.pop()
            t = segment(n) + "".join(ast.unparse(d) for d in n.decorator_list)
            out.append(t)
            for name in sorted(set(re.findall(r"\b(\w+)\(", t)) | set(re.findall(r"self\.(\w+)", t))):
                f = ms.get(name) or funcs.get(name)
                if f is not None and id(f) not in seen:
                    seen.add(id(f))
                    todo.append(f)
        return "\n".join(out)

    cases = []
    for c in classes.values():
        if not is_testcase(c):
            continue
        ms = methods(c)
        setup = "".join(text(ms[k], ms) for k in ("setUp", "setUpClass") if k in ms)
        setup += "".join(ast.unparse(d) for d in c.decorator_list)
        for name, node in ms.items():
            if name.startswith("test"):
                t = text(node, ms) + setup
                t = "\n".join(ln for ln in t.splitlines() if not re.search(SKIP_LINES, ln))
                hit = INTERNAL.search(t)
                cases.append((f"{c.name}.{name}", hit.group(0) if hit else None))
    return cases


def import_root(path: Path) -> tuple[str, str]:
    """(the folder holding the file's top package, the file's dotted module name), or ("", "") for a
    file outside a package (test files import `test.helpers` etc. from their repository)."""
    parts, folder = [path.stem], path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return (str(folder), ".".join(parts)) if len(parts) > 1 else ("", "")


def run_workers(path: Path, names: list[str], jobs: int, timeout: int, env: dict) -> dict[str, dict]:
    """Run the named cases in `jobs` worker processes; returns name -> {kind, text}."""
    root, modname = import_root(path)
    code = WORKER.format(shim=str(HERE), repo=str(REPO), root=root, modname=modname, path=str(path),
                         timeout=timeout)
    procs = []
    for j in range(min(jobs, len(names))):
        share = names[j::jobs]
        p = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
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
        err = p.stderr.read()
        p.wait()
        for name in share:  # a worker that crashed (import error, segfault) loses the rest of its share
            results.setdefault(name, {"name": name, "kind": "error",
                                      "text": f"worker exited {p.returncode}\n{err[-3000:]}"})
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
    m = re.search(r"tinygrad internal ([\w.]+) is not in the shim", text)
    if m:
        return f"tinygrad internal {m.group(1)}"
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


def run_file(path: Path, args, env: dict) -> tuple[list[str], dict[str, dict], int]:
    """Every user-facing case of one file: (names, results, how many were excluded as internal)."""
    cases = test_cases(path)
    excluded = sum(internal is not None for _, internal in cases)
    names = [n for n, internal in cases if internal is None and any(k in n for k in args.k or [""])]
    if not names:
        return names, {}, excluded
    results = run_workers(path, names, args.jobs, args.timeout, env)
    failed = [n for n in names if results[n]["kind"] in ("fail", "error")]
    if failed:  # the int64 rule: rerun with int32 as the default integer
        again = run_workers(path, failed, args.jobs, args.timeout, {**env, "TGRAD_SHIM_DEFAULT_INT": "int32"})
        for n in failed:
            if again[n]["kind"] == "pass":
                results[n] = {**results[n], "kind": "pass_int64"}
    return names, results, excluded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_files", type=Path, nargs="*", help="tinygrad test files (test/backend/test_ops.py)")
    ap.add_argument("--tinygrad", type=Path, help="tinygrad's repository: run its USER_FILES")
    ap.add_argument("--device", default="NUMPY", help="tgrad device the cases run on (default NUMPY)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per case")
    ap.add_argument("-k", action="append", help="only cases whose name contains this (repeat: any of them)")
    ap.add_argument("--forward-only", action="store_true", help="FORWARD_ONLY=1: skip the gradient checks")
    ap.add_argument("--json", type=Path, help="write every case's result here")
    ap.add_argument("--show", type=int, default=0, help="print the traceback tail of this many failures")
    args = ap.parse_args()
    files = [f.resolve() for f in args.test_files]
    if args.tinygrad:
        files += [(args.tinygrad / f).resolve() for f in USER_FILES]
    env = {**os.environ, "DEVICE": args.device, "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}"}
    env.pop("DEBUG", None)
    env["RUN_SLOW"] = "1"  # test_nn and test_optim are marked slow: they are user-facing tests all the same
    if args.forward_only:
        env["FORWARD_ONLY"] = "1"
    t0 = time.time()
    everything: list[tuple[str, dict]] = []
    print("| file | cases | internal (excluded) | pass | of them int64-only | fail | error | skip |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for path in files:
        names, results, excluded = run_file(path, args, env)
        c = collections.Counter(results[n]["kind"] for n in names)
        label = "/".join(path.parts[-2:]) if path.parent.name != "test" else path.name
        print(f"| {label} | {len(names)} | {excluded} | {c['pass'] + c['pass_int64']} | {c['pass_int64']} | "
              f"{c['fail']} | {c['error']} | {c['skip']} |", flush=True)
        everything += [(f"{label}::{n}", results[n]) for n in names]
    counts = collections.Counter(r["kind"] for _, r in everything)
    passed = counts["pass"] + counts["pass_int64"]
    ran = len(everything) - counts["skip"]
    print(
        f"\n{len(everything)} cases on {args.device}{' (forward only)' if args.forward_only else ''} "
        f"in {time.time() - t0:.0f} s: {passed} pass ({counts['pass_int64']} of them only with int32 as "
        f"the default int), {counts['fail']} fail, {counts['error']} error, {counts['skip']} skipped; "
        f"pass rate {passed / max(ran, 1):.1%} of {ran} run"
    )
    reasons = collections.Counter()
    examples: dict[str, list[str]] = collections.defaultdict(list)
    bad = [(n, r) for n, r in everything if r["kind"] in ("fail", "error")]
    for n, r in bad:
        why = reason(r["text"])
        reasons[why] += 1
        examples[why].append(n.split(".")[-1])
    print("\nfailures by reason:")
    for why, c in reasons.most_common():
        shown = ", ".join(examples[why][:4]) + (", ..." if c > 4 else "")
        print(f"  {c:4d}  {why}   [{shown}]")
    for n, r in bad[: args.show]:
        print(f"\n=== {n}\n{r['text'][-1500:]}")
    if args.json:
        args.json.write_text(json.dumps([{**r, "name": n} for n, r in everything], indent=1))


if __name__ == "__main__":
    main()
