"""How much does work beside training slow a training step, and why a persist process helps.

Trains a plain torch MLP (Adam, one torch thread, state ~``--mb`` MB) and times its steps
while, in turn: nothing runs beside it; a Python thread spins (holds the GIL); a process
spins; a process copies memory; autockpt persists the state in a loop from a writer thread
(``persist_mode="thread"``'s path: ``LocalStorage.write_atomic`` of ``save_tree``); and the
same from the persist process (``persist_mode="process"``'s path). Each competitor runs for
``--steps`` steps, ``--rounds`` times in alternating order; the table shows the median step
time and its ratio to the clean one. Writes ``--json``.

    python examples/persist_interference.py --mb 100 --json interference.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from autockpt_core.persist.persist_process import PersistProcess, PortableWrite
from autockpt_core.persist.shared_memory import SharedArena
from autockpt_core.persist.storage import LocalStorage
from autockpt_torch import WRITE_TREE, save_tree, snapshot_tree, torch_shared_pool

SPIN = "while True: pass"
MEMCPY = "import numpy as np\na = np.ones(64 << 20, np.uint8); b = np.empty_like(a)\nwhile True: np.copyto(b, a)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100, help="training state size in MB (default 100)")
    parser.add_argument("--steps", type=int, default=30, help="steps timed per competitor and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="persist-interference.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    width = int((args.mb * 1e6 / 12 / 4) ** 0.5)  # 4 square layers; weights + 2 Adam moments, float32
    net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    x = torch.randn(16, width)

    def step() -> None:
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()

    for _ in range(5):
        step()
    arena = SharedArena()
    pool = torch_shared_pool(arena)
    pool.begin_round()
    tree, nbytes = snapshot_tree({"state_dict": net.state_dict(), "optimizer": opt.state_dict()}, pool)
    pool.end_round()
    directory = tempfile.mkdtemp(prefix="autockpt-interference-")
    storage = LocalStorage(directory)
    process = PersistProcess(arena, (WRITE_TREE.partition(":")[0],))
    process.start()
    process.wait_ready(120)

    def persist_loop(write: Callable[[], object]) -> Callable[[threading.Event], None]:
        def loop(stop: threading.Event) -> None:
            while not stop.is_set():
                write()

        return loop

    def spin_thread(stop: threading.Event) -> None:
        while not stop.is_set():
            pass

    competitors: dict[str, Any] = {
        "nothing": None,
        "Python thread spinning (holds the GIL)": spin_thread,
        "process spinning": [sys.executable, "-c", SPIN],
        "process copying memory": [sys.executable, "-c", MEMCPY],
        "autockpt persist, writer thread": persist_loop(
            lambda: storage.write_atomic("t.ckpt", lambda f: save_tree(tree, f))
        ),
        "autockpt persist, persist process": persist_loop(
            lambda: process.write_atomic(storage, "p.ckpt", PortableWrite(WRITE_TREE, {"tree": tree}))
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in competitors}
    for round_ in range(args.rounds):
        order = list(competitors) if round_ % 2 == 0 else list(reversed(competitors))
        for name in order:
            what = competitors[name]
            stop = threading.Event()
            proc = thread = None
            if isinstance(what, list):
                proc = subprocess.Popen(what)
                time.sleep(0.5)
            elif what is not None:
                thread = threading.Thread(target=what, args=(stop,), daemon=True)
                thread.start()
                time.sleep(0.2)
            for _ in range(args.steps):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
            stop.set()
            if proc is not None:
                proc.kill()
                proc.wait()
            if thread is not None:
                thread.join()
    process.close()
    clean = statistics.median(times["nothing"])
    rows = [
        {"beside training": name, "median step ms": statistics.median(v) * 1e3, "÷ clean": statistics.median(v) / clean}
        for name, v in times.items()
    ]
    table = Table(title=f"Training step ({nbytes / 1e6:.0f} MB state, 1 torch thread, {os.cpu_count()} cores)")
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "beside training" else "right")
    for row in rows:
        table.add_row(row["beside training"], f"{row['median step ms']:.1f}", f"{row['÷ clean']:.2f}")
    Console(width=120).print(table)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump({"state_bytes": nbytes, "cores": os.cpu_count(), "steps": args.steps, "rounds": args.rounds,
                   "rows": rows, "raw_s": times}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
