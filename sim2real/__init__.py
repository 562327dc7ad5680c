"""Everything that leaves the simulator.

- :mod:`legion.sim2real.export`: ``legion export``, the policy as verified ONNX with its metadata.
- :mod:`legion.sim2real.deploy`: the edge runtime (numpy + onnxruntime only) and a MuJoCo robot.
- :mod:`legion.sim2real.sim2sim`: ``legion sim2sim``, the exported policy in MuJoCo next to Newton.

Importing this package imports nothing else, so ``legion.sim2real.deploy`` runs without torch or warp.
"""
