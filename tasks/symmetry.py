"""Left-right symmetry: the mirror image, in the robot's sagittal (x-z) plane, of a state, an
observation and an action.

A robot declares its mirror map in its config (``robot.mirror``): which joint names swap left and
right (``swap``: substrings, e.g. ``{"FL_": "FR_", "RL_": "RR_"}`` or ``{"left_": "right_"}``),
and which joints turn the other way in the mirror (``negate``: a regex). A rotation about an axis
that lies in the mirror plane (roll about x, yaw about z) turns the other way in the mirror; one
about the plane's normal (pitch, about y) keeps its sense. Everything else follows from the task's terms:
each observation term has a rule here (:data:`TERM_RULES`), so a group's mirror is a signed
permutation of its columns, built once from the env's observation layout.

    mirror = Mirror(env)
    mirror.observations(obs)   # TensorDict -> the same groups, mirrored
    mirror.actions(actions)    # (N, A) -> mirrored
    mirror.augment(env, obs, actions)   # rsl-rl's symmetry extension: originals, then their mirror

Under the mirror y -> -y, a polar vector (velocity, gravity) negates its y component and an axial
one (angular velocity) its x and z; a base-frame quantity mirrors the same way because the mirror
plane is the base's own sagittal plane.
"""

from __future__ import annotations

import inspect
import re

import torch
from tensordict import TensorDict

POLAR, AXIAL = (1.0, -1.0, 1.0), (-1.0, 1.0, -1.0)


class MirrorError(ValueError):
    """A mirror map or a task that cannot be mirrored; the message names the joint or the term."""


class Mirror:
    """The signed permutations that mirror ``env``'s joints, actions and observation groups."""

    def __init__(self, env):
        cfg = env.cfg.scene.robot.mirror
        robot, self.device = env.robot, env.device
        if not cfg.swap:
            raise MirrorError(f"robot {env.cfg.scene.robot.file} declares no mirror map: set robot.mirror.swap (the "
                              "left/right substrings of its joint names) and robot.mirror.negate (as configs/robot/"
                              "go2.yaml does)")
        names = list(robot.joint_names)
        self.joint_perm, self.joint_sign = joint_map(names, cfg.swap, cfg.negate)
        perm, sign = self.joint_perm.to(env.device), self.joint_sign.to(env.device)
        default = robot.default_joint_pos[0]
        asymmetric = (default[perm] * sign - default).abs() > 1e-6
        if asymmetric.any():
            bad = [names[i] for i in asymmetric.nonzero().flatten().tolist()]
            raise MirrorError(f"the default pose is not its own mirror at joints {bad}: a mirrored policy would "
                              "stand differently (task.scene.robot.joint_pos)")
        action = env.action
        if not hasattr(action, "joint_ids") or action.dim != len(action.joint_ids):
            raise MirrorError(f"task.action.type={env.cfg.action.type} cannot be mirrored: only joint actions have a "
                              "mirror map")
        self.action_perm, self.action_sign = (t.to(env.device) for t in _restrict(
            action.joint_ids, self.joint_perm, self.joint_sign, "the action"))
        self.groups = {group: self._group_map(group, terms) for group, terms in env.observation_layout().items()}

    def _group_map(self, group: str, terms: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        perms, signs = [], []
        for term in terms:
            rule = TERM_RULES.get(term["func"])
            if rule is None:
                raise MirrorError(f"task.observations.{group}.{term['name']}: no mirror rule for the term function "
                                  f"{term['func']} (legion.tasks.symmetry.TERM_RULES)")
            perm, sign = rule(self, term)
            if len(perm) != term["size"]:
                raise MirrorError(f"task.observations.{group}.{term['name']}: its mirror rule covers {len(perm)} "
                                  f"values, the term has {term['size']}")
            perms.append(perm + term["start"])
            signs.append(sign)
        return torch.cat(perms).to(self.device), torch.cat(signs).to(self.device)

    def actions(self, actions: torch.Tensor) -> torch.Tensor:
        return actions[..., self.action_perm] * self.action_sign

    def observations(self, obs: TensorDict) -> TensorDict:
        return TensorDict({g: obs[g][..., self.groups[g][0]] * self.groups[g][1] for g in obs.keys()},
                          batch_size=obs.batch_size, device=obs.device)

    def augment(self, env=None, obs: TensorDict | None = None, actions: torch.Tensor | None = None):
        """rsl-rl's ``data_augmentation_func``: the originals followed by their mirror images."""
        return (None if obs is None else torch.cat([obs, self.observations(obs)]),
                None if actions is None else torch.cat([actions, self.actions(actions)]))


def mirror_root(pose: torch.Tensor, vel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mirror image of root poses (..., 7: position, quaternion x y z w) and velocities (..., 6:
    linear, angular), world frame, in the world's x-z plane."""
    polar = torch.tensor(POLAR, device=pose.device)
    axial = torch.tensor(AXIAL, device=pose.device)
    quat = pose[..., 3:7] * torch.tensor((-1.0, 1.0, -1.0, 1.0), device=pose.device)  # R -> M R M
    return (torch.cat([pose[..., :3] * polar, quat], dim=-1),
            torch.cat([vel[..., :3] * polar, vel[..., 3:] * axial], dim=-1))


def joint_map(names: list[str], swap: dict[str, str], negate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(J,) index of each joint's mirror partner and (J,) its sign, from name substitutions both
    ways and the regex of the joints that negate; raises :class:`MirrorError` naming a joint whose
    partner is missing or not mutual."""
    pairs = list(swap.items()) + [(b, a) for a, b in swap.items()]

    def partner(name: str) -> str:
        for a, b in pairs:
            if a in name:
                return name.replace(a, b)
        return name

    index = {name: i for i, name in enumerate(names)}
    perm, sign = [], []
    for name in names:
        other = partner(name)
        if other not in index:
            raise MirrorError(f"robot.mirror.swap maps joint {name} to {other}, which the robot does not have "
                              f"(its joints: {', '.join(names)})")
        if partner(other) != name:
            raise MirrorError(f"robot.mirror.swap: joint {name} -> {other} -> {partner(other)}; the map must be "
                              "its own inverse")
        negated = bool(negate) and re.fullmatch(negate, name) is not None
        if negated != (bool(negate) and re.fullmatch(negate, other) is not None):
            raise MirrorError(f"robot.mirror.negate matches one of {name} and {other}, not both: mirror partners "
                              "turn the same way")
        perm.append(index[other])
        sign.append(-1.0 if negated else 1.0)
    return torch.tensor(perm), torch.tensor(sign)


def _restrict(ids, perm: torch.Tensor, sign: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The joint map on a subset of joints (``ids``, in their order), which must hold each one's partner."""
    ids = torch.as_tensor(ids, dtype=torch.long).cpu().flatten()
    position = {int(j): k for k, j in enumerate(ids)}
    missing = [int(perm[j]) for j in ids if int(perm[j]) not in position]
    if missing:
        raise MirrorError(f"{what} holds joints {ids.tolist()} but not their mirror partners {missing}")
    return torch.tensor([position[int(perm[j])] for j in ids]), sign[ids]


def _fixed(signs):
    return lambda mirror, term: (torch.arange(len(signs)), torch.tensor(signs))


def _joints(mirror: Mirror, term: dict):
    return _restrict(term["params"]["joints"], mirror.joint_perm, mirror.joint_sign, f"term {term['name']}")


def _height_scan(mirror: Mirror, term: dict):
    from legion.tasks.mdp.observations import height_scan, scan_points

    params = {k: p.default for k, p in inspect.signature(height_scan).parameters.items()} | term["params"]
    points = scan_points(tuple(params["size"]), float(params["resolution"]))
    nx = int((points[:, 1] == points[0, 1]).sum())  # x varies fastest
    k = torch.arange(len(points))
    iy, ix = k // nx, k % nx
    ny = len(points) // nx
    return (ny - 1 - iy) * nx + ix, torch.ones(len(points))


# Term function -> (mirror, layout entry) -> (index, sign) of each of its values' mirror images.
TERM_RULES = {
    "base_lin_vel": _fixed(POLAR),
    "projected_gravity": _fixed(POLAR),
    "base_ang_vel": _fixed(AXIAL),
    "velocity_commands": _fixed((1.0, -1.0, -1.0)),  # v_x, v_y, yaw rate
    "base_height": _fixed((1.0,)),
    "joint_pos_rel": _joints,
    "joint_vel": _joints,
    "last_action": lambda mirror, term: (mirror.action_perm.cpu(), mirror.action_sign.cpu()),
    "height_scan": _height_scan,
}
