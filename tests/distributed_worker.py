"""One rank of a distributed test run (started by torchrun from tests/test_distributed.py).

    python -m torch.distributed.run ... tests/distributed_worker.py OUT_DIR [key=value ...] [--then OUT_DIR ...]

Trains through legion.commands.train.train into OUT_DIR/run and writes OUT_DIR/rank<R>.json: a checksum of
the policy's and the critic's weights after every update (PPO's, or an off-policy learner's gradient
step), the last update's losses, whether the actor is recurrent, and rank 0's training history.
Each `--then` starts another training, in turn, in the same processes (their start-up paid once) and
the same process group (gloo's rendezvous cannot be made twice in one torchrun).
LEGION_TEST_DIE_AT=<iteration> makes the last rank exit abruptly once it has finished that iteration.
"""

import hashlib
import itertools
import json
import os
import sys
from pathlib import Path

from rsl_rl.algorithms import PPO

from legion import configs
from legion.agents import distributed
from legion.agents.off_policy import OffPolicyLearner
from legion.commands.train import train

rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
checksums, losses = [], {}
die_at = int(os.environ.get("LEGION_TEST_DIE_AT", "0"))


def checksummed(update):
    return lambda self, *args: update_and_checksum(self, update, *args)


def update_and_checksum(self, update, *args):
    result = update(self, *args)
    losses.update({name: float(value) for name, value in result.items()})
    weights = [t for model in (self.actor, self.critic) for t in model.state_dict().values()]
    checksums.append(hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in weights)).hexdigest())
    if die_at and rank == world - 1 and len(checksums) == die_at:
        os._exit(17)  # no cleanup, no goodbye: as a crash or a kill -9 leaves the others
    return result


PPO.update = checksummed(PPO.update)
OffPolicyLearner.update = checksummed(OffPolicyLearner.update)
leave, distributed.leave = distributed.leave, lambda: None
trainings = [list(args) for then, args in itertools.groupby(sys.argv[1:], lambda arg: arg == "--then") if not then]
for out, *overrides in trainings:
    checksums.clear()
    losses.clear()
    runner = train(configs.compose(*overrides), Path(out) / "run")
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({
        "checksums": checksums, "losses": losses, "recurrent": runner.policy.is_recurrent,
        "mean_episode_length": runner.mean_episode_length,
        "episodes": runner.log.episodes, "seed_state": runner.env.generator.initial_seed()}))
leave()
