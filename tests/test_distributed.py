"""Training over torch.distributed with real processes on the CPU (gloo): identical weights on
every rank after every update (recurrent and symmetric PPO included), the same learning as one
process with all the envs, a lost rank makes the others stop with a message, parallel Hydra sweeps."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

WORKER = str(ROOT / "tests" / "distributed_worker.py")
CARTPOLE = ["task=cartpole", "agent.num_steps_per_env=16", "agent.save_interval=1000"]


def environ(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def torchrun(*args, nproc=2, extra_env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                           *args], env=environ(**(extra_env or {})), capture_output=True, text=True, timeout=timeout)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (torchrun starts its ranks in sessions of their own)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    doomed, frontier = {pid}, [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, parent in parents.items() if parent == current]
        doomed.update(children)
        frontier += children
    for p in doomed:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_hold_identical_weights_and_learn_like_one_process_with_all_the_envs(tmp_path, seed, learned):
    iterations = 25
    result = torchrun(WORKER, str(tmp_path / "two"), *CARTPOLE, "sim.num_envs=128", f"seed={seed}",
                      f"agent.max_iterations={iterations}")
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert len(ranks[0]["checksums"]) == iterations
    assert ranks[0]["checksums"] == ranks[1]["checksums"]  # every update, bit for bit
    assert ranks[0]["seed_state"] != ranks[1]["seed_state"]  # each rank its own envs: seed + rank
    assert "x 2 ranks (gloo)" in result.stdout and result.stdout.count("[it 25/25]") == 1  # rank 0 prints
    assert (tmp_path / "two" / "run" / f"model_{iterations}.pt").is_file()

    single = subprocess.run([sys.executable, WORKER, str(tmp_path / "one"), *CARTPOLE, "sim.num_envs=256",
                             f"seed={seed}", f"agent.max_iterations={iterations}"], env=environ(), capture_output=True,
                            text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "rank0.json").read_text())
    # The same samples per update: the episode lengths reached agree within run-to-run noise. Over
    # training seeds 0-19 the shorter of the two was 78-185 steps (mean 142, sd 28) and 0.49-0.96 of
    # the longer (mean 0.82, sd 0.12): bounds 60 and 0.4, 3.0 and 3.6 sd below the means.
    lengths = ranks[0]["mean_episode_length"], one["mean_episode_length"]
    print(f"mean episode length after {iterations} iterations: 2 ranks x 128 envs {lengths[0]:.1f}, "
          f"1 process x 256 envs {lengths[1]:.1f}")
    learned(shorter_length=(min(lengths), 60.0), shorter_over_longer=(min(lengths) / max(lengths), 0.4))


LEARNERS = {
    "sac-sync": (*CARTPOLE, "sim.num_envs=16", "agent=sac", "agent.off_policy.batch_size=64",
                 "agent.off_policy.learning_starts=2", "agent.off_policy.prioritized=true"),
    "lstm-async": (*CARTPOLE, "sim.num_envs=32", "agent.mode=async", "agent.actor.rnn.type=lstm",
                   "agent.actor.rnn.hidden_size=32"),
    "symmetry-sync": ("task=quadruped_flat", "sim.num_envs=16", "agent.num_steps_per_env=8",
                      "agent.save_interval=1000", "agent.mode=sync", "agent.symmetry.augmentation=true",
                      "agent.symmetry.mirror_loss=true"),
}


@pytest.mark.bit_exact
def test_recurrent_symmetric_and_off_policy_learners_keep_every_rank_identical(tmp_path):
    """Over two ranks, SAC (each rank its own buffer, prioritized), an LSTM actor under async PPO
    (each rank's learner on its own actor's sequences) and the symmetry extension (augmentation and
    the mirror loss) end every update with the same weights on both ranks, and the weights move.
    One after another in the same two processes: their start-up once."""
    iterations, trainings = 3, []
    for name, overrides in LEARNERS.items():
        trainings += ["--then", str(tmp_path / name), *overrides, f"agent.max_iterations={iterations}"]
    result = torchrun(WORKER, *trainings[1:])
    assert result.returncode == 0, result.stderr[-3000:]
    for name in LEARNERS:
        ranks = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in (0, 1)]
        assert ranks[0]["checksums"] == ranks[1]["checksums"], name  # every update, bit for bit
        updates = 2 * (iterations * 16 - 2 + 1) if name == "sac-sync" else iterations  # SAC: gradient steps
        assert len(set(ranks[0]["checksums"])) == updates, name  # each update changed them
        if name == "sac-sync":  # each rank's critic loss on its own batches, its own buffer
            assert ranks[0]["losses"]["critic"] != ranks[1]["losses"]["critic"]
        elif name == "lstm-async":
            assert ranks[0]["recurrent"] and ranks[1]["recurrent"]
        else:  # the mirror loss was computed (rank-local: each rank's own mini-batches)
            assert all(0 < rank["losses"]["symmetry"] < float("inf") for rank in ranks)
            assert ranks[0]["losses"]["symmetry"] != ranks[1]["losses"]["symmetry"]


def test_a_rank_on_another_node_that_is_killed_stops_the_others_with_a_message(tmp_path):
    """Two torchrun invocations on localhost as two 'nodes' (the documented multi-node setup); the
    second node is killed after the 3rd iteration: the first exits with a message, without hanging."""
    port = free_port()
    common = ["--nnodes=2", "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "legion",
              "train", *CARTPOLE, "sim.num_envs=64", "agent.max_iterations=null"]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--node_rank={n}", *common],
                              cwd=tmp_path, env=environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for n in (0, 1)]
    try:
        for line in nodes[0].stdout:  # rank 0 prints the progress
            if line.startswith("[it 3]"):
                break
        kill_tree(nodes[1].pid)  # the whole node: its torchrun and its rank
        killed = time.time()
        out0, err0 = nodes[0].communicate(timeout=120)
        waited = time.time() - killed
    finally:
        for node in nodes:
            kill_tree(node.pid)
    print(f"rank 0 exited {waited:.1f} s after node 1 was killed")
    assert nodes[0].returncode != 0 and waited < 60
    assert "legion train: rank 0 of 2: another rank stopped answering" in err0
    assert "continue with legion train resume=" in err0


def test_legion_train_nproc_starts_torchrun_and_a_joblib_sweep_runs_in_parallel(tmp_path):
    tiny = ["sim.num_envs=32", "agent.max_iterations=2", "agent.num_steps_per_env=8"]
    run = subprocess.run([sys.executable, "-m", "legion", "train", "--nproc", "2", *tiny], cwd=tmp_path, env=environ(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "x 2 ranks (gloo)" in run.stdout and len(list(tmp_path.glob("runs/cartpole/*/model_2.pt"))) == 1

    sweep = subprocess.run([sys.executable, "-m", "legion", "train", "-m", "hydra/launcher=joblib", "seed=0,1",
                            *tiny], cwd=tmp_path, env=environ(), capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "Joblib.Parallel" in sweep.stdout + sweep.stderr
    runs = sorted(Path(tmp_path, "runs", "multirun").glob("*/cartpole_*"))
    assert [r.name for r in runs] == ["cartpole_0", "cartpole_1"]
    assert all((r / "model_2.pt").is_file() for r in runs)
