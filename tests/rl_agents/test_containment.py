"""An agent cannot take the run down: whatever it raises (``SystemExit`` and ``KeyboardInterrupt`` included), a
blocked event loop or a child process that hangs ends its own episode within ``time_limit_s`` and a small bound,
and the other episodes finish; Ctrl-C still ends a run whose agents are stuck."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tool_writer import drive

from rl_core.contracts.protocols import SamplingParams

KINDS = ["exits", "interrupts", "blocks", "child", "fine"]


def test_an_agent_that_exits_interrupts_blocks_its_loop_or_hangs_in_a_child_costs_its_episode_only(
    tool_config, tokenizer
):
    rows = [{"prompt": f"Add {i}+1.", "kind": kind} for i, kind in enumerate(KINDS)]
    start = time.monotonic()
    scored, _ = drive(
        tool_config, tokenizer, "scripted_agents:escaping", rows, SamplingParams(n=1, max_new_tokens=200, seed=2),
        time_limit_s=2.0,
    )  # fmt: skip
    took = time.monotonic() - start
    ended = [t["ended"] for t in scored.transcripts]
    assert ended == [
        "error: AgentExit: SystemExit: 3",
        "error: AgentExit: KeyboardInterrupt: ",
        "timeout",
        "timeout",
        "done",
    ]
    assert scored.rewards == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert took < 2.0 + 5.0, f"the batch took {took:.1f} s: stuck agents are given up at their time limit"


STUCK = """
import faulthandler, sys, threading, time
faulthandler.enable()
sys.path[:0] = {paths!r}
from tool_writer import drive, tool_overrides
from rl_core.config.loader import load_config
from rl_core.plugins.registry import Registry
from transformers import AutoTokenizer

config = load_config(None, tool_overrides({run!r}, {model!r}), Registry.discover())
tokenizer = AutoTokenizer.from_pretrained({model!r})
rows = [{{"prompt": "Add 1+1.", "kind": kind}} for kind in ("blocks", "child", "fine")]
threading.Timer(2.0, lambda: print("agents stuck", flush=True)).start()
try:
    drive(config, tokenizer, "scripted_agents:escaping", rows, time_limit_s=600.0)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_ctrl_c_ends_a_run_whose_agents_are_stuck(tiny_model_path, tmp_path):
    here = Path(__file__).parent
    script = STUCK.format(paths=[str(here), str(here.parent)], run=str(tmp_path / "run"), model=str(tiny_model_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "agents stuck" in line:
            break
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # its threads' stacks, from faulthandler
        out = proc.communicate()[0]
    assert "interrupted" in out, out[-4000:]
    assert time.monotonic() - sent < 10, "no stuck agent's thread holds the process open"
