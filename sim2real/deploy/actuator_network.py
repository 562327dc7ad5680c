"""An actuator network: a small MLP that maps a joint's recent position errors and velocities to
the torque its motor produces (Hwangbo et al., "Learning agile and dynamic motor skills for legged
robots", Science Robotics 2019: the ANYmal's series-elastic actuators, learned from logs).

One network drives every joint of an actuator group (``task.scene.robot.actuators.<group>: {model:
network, network: <file>}``). Its input, per joint, is ``history`` position errors ``q* - q`` and
then as many velocities ``dq``, from now back in steps of ``stride_s`` seconds; its output is the
joint's torque [N m], clipped to the joint's effort limit by whoever applies it. ``legion calibrate
... actuator_network=true`` learns one from a robot's logs, with the motors' ``tau_est`` as labels
(on a Unitree robot an estimate from the motor current, not a torque sensor's reading).

The file is a numpy ``.npz`` (read here without torch: the simulator evaluates it in torch for all
worlds at once, :class:`~legion.tasks.sim.simulation.NewtonSim`; plain MuJoCo robots in numpy):
``meta`` (JSON: ``format``, ``history``, ``stride_s``, ``activation``, ``output_scale``
multiplying the last layer's output, the number of ``layers``, and ``info``: what it was learned
from), ``input_mean``/``input_std`` (2 history,) normalizing the input, and per layer its weights
``w<i>`` (out, in) and biases ``b<i>``.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = "legion-actuator-network/1"
ACTIVATIONS = {"softsign": lambda x: x / (1.0 + np.abs(x)), "tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}


@dataclass
class ActuatorNetwork:
    """An actuator network's parameters (:func:`load` reads one, :meth:`save` writes it)."""

    weights: list[np.ndarray]  # per layer (out, in)
    biases: list[np.ndarray]  # per layer (out,)
    input_mean: np.ndarray  # (2 history,) errors first, then velocities
    input_std: np.ndarray  # (2 history,)
    output_scale: float = 1.0  # [N m] per unit of the last layer's output
    history: int = 3  # instants of error and velocity, now first
    stride_s: float = 0.02  # [s] between two instants
    activation: str = "softsign"  # between layers (none after the last)
    info: dict = field(default_factory=dict)  # what it was learned from (calibrate writes it)

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: one of {sorted(ACTIVATIONS)}")
        if self.history < 1 or self.stride_s <= 0:
            raise ValueError(f"history {self.history} and stride_s {self.stride_s}: need history >= 1, stride_s > 0")
        width = 2 * self.history
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if w.ndim != 2 or w.shape[1] != width or b.shape != (w.shape[0],):
                raise ValueError(f"layer {i}: weights {w.shape} and biases {b.shape} do not take {width} inputs")
            width = w.shape[0]
        if not self.weights or width != 1:
            raise ValueError(f"the last layer gives {width} outputs: an actuator network gives one torque per joint")
        if self.input_mean.shape != (2 * self.history,) or self.input_std.shape != (2 * self.history,):
            raise ValueError(f"input_mean {self.input_mean.shape} and input_std {self.input_std.shape}: need "
                             f"({2 * self.history},), the errors' and the velocities' history")

    def steps(self, dt: float) -> int:
        """``stride_s`` in steps of ``dt``; ValueError where it is not a whole number of them."""
        steps = round(self.stride_s / dt)
        if steps < 1 or abs(steps * dt - self.stride_s) > 1e-6 * self.stride_s:
            raise ValueError(f"the actuator network reads its history every {self.stride_s} s, not a whole number of "
                             f"physics steps of {dt} s: learn it at a stride the physics rate divides")
        return steps

    def __call__(self, errors: np.ndarray, velocities: np.ndarray) -> np.ndarray:
        """Torques (...,) from position errors and velocities (..., history), now first."""
        x = (np.concatenate([errors, velocities], axis=-1) - self.input_mean) / self.input_std
        act = ACTIVATIONS[self.activation]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = x @ w.T + b
            if i < len(self.weights) - 1:
                x = act(x)
        return x[..., 0] * self.output_scale

    def contract(self) -> dict:
        """Its parameters as the policy contract's ``actuator_networks`` entry holds them."""
        return {"history": self.history, "stride_s": self.stride_s, "activation": self.activation,
                "output_scale": self.output_scale, "input_mean": self.input_mean.tolist(),
                "input_std": self.input_std.tolist(), "weights": [w.tolist() for w in self.weights],
                "biases": [b.tolist() for b in self.biases]}

    @classmethod
    def from_contract(cls, entry) -> ActuatorNetwork:
        """From a policy contract's ``actuator_networks`` entry."""
        return cls(weights=[np.asarray(w, np.float64) for w in entry.weights],
                   biases=[np.asarray(b, np.float64) for b in entry.biases],
                   input_mean=np.asarray(entry.input_mean, np.float64),
                   input_std=np.asarray(entry.input_std, np.float64),
                   output_scale=entry.output_scale, history=entry.history, stride_s=entry.stride_s,
                   activation=entry.activation)

    def save(self, path: str | Path) -> Path:
        meta = {"format": FORMAT, "history": self.history, "stride_s": self.stride_s, "activation": self.activation,
                "output_scale": self.output_scale, "layers": len(self.weights), "info": self.info}
        arrays = {f"w{i}": w for i, w in enumerate(self.weights)} | {f"b{i}": b for i, b in enumerate(self.biases)}
        with open(path, "wb") as f:  # a file object: numpy adds no ".npz" to the name asked for
            np.savez(f, meta=np.array(json.dumps(meta)), input_mean=self.input_mean, input_std=self.input_std,
                     **arrays)  # pyright: ignore[reportArgumentType]
        return Path(path)


def load(path: str | Path) -> ActuatorNetwork:
    """The actuator network in ``path``; ValueError naming the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"actuator network {path}: no such file (`legion calibrate ... actuator_network=true` "
                         "writes actuator_network.npz)")
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            if meta.get("format") != FORMAT:
                raise ValueError(f"its format is {meta.get('format')!r}, not {FORMAT!r}")
            layers = int(meta["layers"])
            network = ActuatorNetwork(
                weights=[data[f"w{i}"].astype(np.float64) for i in range(layers)],
                biases=[data[f"b{i}"].astype(np.float64) for i in range(layers)],
                input_mean=data["input_mean"].astype(np.float64), input_std=data["input_std"].astype(np.float64),
                output_scale=float(meta["output_scale"]), history=int(meta["history"]),
                stride_s=float(meta["stride_s"]), activation=meta["activation"], info=meta.get("info", {}))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise ValueError(f"actuator network {path}: not a readable {FORMAT} file ({error}); write it again with "
                         "`legion calibrate ... actuator_network=true`") from error
    if not all(np.isfinite(a).all() for a in (*network.weights, *network.biases, network.input_mean,
                                               network.input_std, network.output_scale)) \
            or (network.input_std <= 0).any():
        raise ValueError(f"actuator network {path}: non-finite weights or scales, or a non-positive input_std")
    return network
