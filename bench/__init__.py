"""tgrad's benchmark suite: `python -m bench --help`.

Workloads are in workloads.py, contenders in contenders.py, the runner in suite.py.
"""
