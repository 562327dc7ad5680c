"""One rank of a distributed test run (started by torchrun from tests/test_distributed.py).

    python -m torch.distributed.run ... tests/distributed_worker.py OUT_DIR [key=value ...]

Trains through legion.commands.train.train into OUT_DIR/run and writes OUT_DIR/rank<R>.json: a checksum of
the policy's and the critic's weights after every update (PPO's, or an off-policy learner's gradient
step), the last update's losses, whether the actor is recurrent, and rank 0's training history.
LEGION_TEST_DIE_AT=<iteration> makes the last rank exit abruptly once it has finished that iteration.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

from rsl_rl.algorithms import PPO

from legion import configs
from legion.agents.off_policy import OffPolicyLearner
from legion.commands.train import train

out, overrides = Path(sys.argv[1]), sys.argv[2:]
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
runner = train(configs.compose(*overrides), out / "run")
(out / f"rank{rank}.json").write_text(json.dumps({
    "checksums": checksums, "losses": losses, "recurrent": runner.policy.is_recurrent,
    "mean_episode_length": runner.mean_episode_length,
    "episodes": runner.log.episodes, "seed_state": runner.env.generator.initial_seed()}))
