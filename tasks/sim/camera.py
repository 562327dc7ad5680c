"""Cameras in every world: Newton's ray-traced ``SensorCamera``, one render call per camera for
all worlds at once, on the simulation's device (Warp's CPU or CUDA kernels), images kept there.
On the C backend a depth-only camera in a scene whose visible shapes are its colliding shapes is
ray cast by MuJoCo's ``mj_multiRay`` instead, in the threads that step the worlds (every core;
the same image: Warp's CPU kernels run on one thread).

Conventions, one definition from training to the robot:

- A camera's frame looks along its +x with +z up and +y left (ROS's camera-link convention);
  ``pos`` and ``quat`` place it in its body's frame (or the env frame). Newton's cameras look
  along -z with +y up (OpenGL's): :data:`GL_IN_CAMERA` turns one into the other.
- **Depth** is planar: metres along the camera's axis (what a RealSense driver and MuJoCo's GL
  renderer give), not the distance along each ray. A pixel with no surface between ``near``
  and ``far`` reads 0 ("no return", a depth camera driver's convention).
- **RGB** is 8-bit sRGB.
- **Segmentation** is a label per pixel (uint8): 0 nothing, 1 the ground, 2 + i the scene's i-th
  entity (the robot 2, then the objects and fixtures in config order): :attr:`Cameras.labels`.
  A simulator's privilege (no robot's camera gives it): for critics, teachers and inspection.

A frame is rendered when it is read after the state changed: every ``period`` control steps for
every world, and for a world that was reset since its last frame (a new episode never sees the
previous one's images). A camera nobody reads costs nothing.
"""

from __future__ import annotations

import math
import os
import re

import torch
import warp as wp

from legion.tasks.math import quat_mul, quat_rotate

CHANNELS = ("depth", "rgb", "segmentation")
BYTES_PER_PIXEL = {"depth": 4, "rgb": 4, "segmentation": 4}  # float32 depth; packed RGBA; uint32 shape index
# A colour per segmentation label (nothing black, the ground grey, the robot orange, then others), cycled
PALETTE = torch.tensor([[0, 0, 0], [110, 110, 110], [255, 140, 0], [30, 144, 255], [50, 205, 50], [220, 20, 60],
                        [238, 130, 238], [255, 215, 0]], dtype=torch.uint8)
# Newton's (OpenGL) camera frame in ours: its x (right) is our -y, its y (up) our z, its z (back) our -x.
GL_IN_CAMERA = (0.5, -0.5, -0.5, 0.5)


def check_cameras(scene, num_envs: int, device: str) -> None:
    """Refuses, naming the camera and what to change, a camera config (``scene.cameras``) that
    cannot render or whose images for ``num_envs`` worlds would not fit in half the device's free
    memory; before the simulation is built."""
    cameras, total = scene.cameras, 0
    for name, cam in cameras.items():
        where = f"task.scene.cameras.{name}"
        unknown = [c for c in cam.channels if c not in CHANNELS]
        if unknown or not cam.channels:
            raise ValueError(f"{where}.channels: {list(cam.channels)}; each one of {list(CHANNELS)}.")
        if cam.width < 1 or cam.height < 1:
            raise ValueError(f"{where}: width and height must be >= 1 pixel, got {cam.width}x{cam.height}.")
        if not 0 < cam.fov < 180:
            raise ValueError(f"{where}.fov: {cam.fov}; a vertical field of view in (0, 180) degrees.")
        if not 0 < cam.near < cam.far:
            raise ValueError(f"{where}: needs 0 < near < far [m], got near={cam.near}, far={cam.far}.")
        if cam.period < 1:
            raise ValueError(f"{where}.period: {cam.period}; a frame every period >= 1 control steps.")
        if len(cam.pos) != 3 or len(cam.quat) != 4:
            raise ValueError(f"{where}: pos takes (x, y, z) [m] and quat (x, y, z, w).")
        total += num_envs * cam.width * cam.height * sum(BYTES_PER_PIXEL[c] for c in cam.channels)
    free = _free_memory(device)
    if total > free / 2:
        sizes = ", ".join(f"{n}: {c.width}x{c.height} {'+'.join(c.channels)}" for n, c in cameras.items())
        raise ValueError(f"task.scene.cameras: the images of {num_envs} worlds ({sizes}) take {total / 2**30:.1f} GiB, "
                         f"more than half of the {free / 2**30:.1f} GiB free on {device}: lower the resolution, "
                         f"drop a channel or use fewer envs (sim.num_envs).")


def scene_camera(env, camera: str):
    """The env's :class:`Cameras` holding ``camera``; raises ValueError naming the scene's cameras."""
    cameras = env.sim.cameras
    if cameras is None or camera not in cameras:
        raise ValueError(f"camera '{camera}' is not in task.scene.cameras "
                         f"({sorted(cameras.cfgs) if cameras is not None else 'none'}).")
    return cameras


def picture(image: torch.Tensor) -> torch.Tensor:
    """One world's image to look at, (H, W, 3) uint8: RGB as it is; depth (H, W) grey, its nearest
    return white, its farthest dark grey, no return black; segmentation labels (H, W) uint8 a colour
    each (:data:`PALETTE`)."""
    if image.dim() == 3:
        return image
    if image.dtype == torch.uint8:
        return PALETTE.to(image.device)[image.long() % len(PALETTE)]
    returns = image[image > 0]
    near, far = (returns.min(), returns.max()) if returns.numel() else (0.0, 1.0)
    grey = torch.where(image > 0, 64 + 191 * (far - image) / max(float(far - near), 1e-6), 0.0)
    return grey.to(torch.uint8)[..., None].expand(*image.shape, 3)


def _free_memory(device: str) -> int:
    if torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


class Cameras:
    """The scene's cameras (``task.scene.cameras``), rendered for every world by one
    ``SensorCamera`` of the simulation's model.

    Args:
        sim: the :class:`~legion.tasks.sim.NewtonSim` (its model, state and robot).
        scene: the :class:`~legion.configs.schema.Scene` (its ``cameras``, checked by
            :func:`check_cameras`).
        lock: held while rendering (Warp's CPU kernels must not run from two threads at once).

    Attributes:
        cfgs: the configs by name.
        labels: segmentation label by name: ``none`` 0, ``ground`` 1, then each scene entity's.
    """

    def __init__(self, sim, scene, lock):
        from newton import ShapeFlags
        from newton.sensors import SensorCamera

        self.sim, self.cfgs, self._lock = sim, dict(scene.cameras), lock
        n, device = sim.num_envs, sim.device
        self.sensor = SensorCamera(sim.model, load_textures=False)
        self.sensor.create_default_light(enable_shadows=False)
        robot = sim.robot
        self._body, self._rays, self._images, self._due = {}, {}, {}, {}
        self.mount_pos, self.mount_quat, self.noise, self.fov, self._render_fov = {}, {}, {}, {}, {}
        self._jittered: set[str] = set()  # cameras whose worlds' fields of view set_fov set
        for name, cam in self.cfgs.items():
            if cam.body is None:
                self._body[name] = None
            else:
                hits = [b for b, label in enumerate(robot.body_names) if re.fullmatch(cam.body, label)]
                if len(hits) != 1:
                    raise ValueError(f"task.scene.cameras.{name}.body: '{cam.body}' names "
                                     f"{'no' if not hits else 'more than one'} body of the robot; "
                                     f"its bodies: {robot.body_names}")
                self._body[name] = robot.slices.bodies.start + hits[0]
            # Per world (randomization events move them): the mount, and the depth noise, holes and colour gain
            self.mount_pos[name] = torch.tensor(cam.pos, dtype=torch.float32, device=device).repeat(n, 1)
            self.mount_quat[name] = torch.tensor(cam.quat, dtype=torch.float32, device=device).repeat(n, 1)
            self.noise[name] = {"depth_noise": torch.zeros(n, device=device), "holes": torch.zeros(n, device=device),
                                "gain": torch.ones(n, 3, device=device)}
            self.fov[name] = torch.full((n,), float(cam.fov), device=device)  # [deg] per world (event camera_fov)
            self._set_rays(name, cam.fov)
            allocate = {"depth": self.sensor.allocate_image_depth_forward, "rgb": self.sensor.allocate_image_color,
                        "segmentation": self.sensor.allocate_image_shape_index}
            self._images[name] = {c: allocate[c](n, cam.width, cam.height) for c in cam.channels}
            self._due[name] = torch.ones(n, dtype=torch.bool, device=device)
        # Segmentation: each shape's label, world after world (the replicated layout), the ground's after
        self.labels = {"none": 0, "ground": 1} | {name: 2 + i for i, name in enumerate(sim.scene)}
        per_world = torch.ones(sim.shapes_per_world, dtype=torch.uint8)
        for name, entity in sim.scene.items():
            per_world[entity.slices.shapes] = self.labels[name]
        self._shape_label = torch.ones(sim.model.shape_count, dtype=torch.uint8)
        self._shape_label[: n * sim.shapes_per_world] = per_world.repeat(n)
        self._shape_label = self._shape_label.to(device)
        self.mount_defaults = {name: (self.mount_pos[name].clone(), self.mount_quat[name].clone())
                               for name in self.cfgs}
        # Image latency (event image_latency): per world, how many control steps late its images are
        # read; the frames of the last steps in a ring per channel, made when a latency is first set.
        self.latency = {name: torch.zeros(n, dtype=torch.long, device=device) for name in self.cfgs}
        self._past: dict[str, dict[str, torch.Tensor]] = {}
        self._pushed: dict[tuple[str, str], int] = {}  # the step whose frame a ring holds last
        # The rings' step count on the device: a captured control step (CUDA) replays its increment.
        self._ring_step = torch.zeros((), dtype=torch.long, device=device)
        self._fresh = {(name, c): torch.ones(n, dtype=torch.bool, device=device)
                       for name, cam in self.cfgs.items() for c in cam.channels}  # reset since: no past frames
        self._gl = torch.tensor(GL_IN_CAMERA, device=device)
        # On the C backend a depth-only camera is ray cast by MuJoCo's mj_multiRay on every core
        # (Warp's CPU kernels, SensorCamera's, run on one thread): its pixels' rays in our frame.
        # MuJoCo's model holds the colliding shapes and the camera sees the visible ones: only where
        # they are the same shapes (no visual-only mesh, no invisible collider) is that one image.
        self._multiray = {}
        flags = sim.model.shape_flags.numpy()
        seen = (flags & int(ShapeFlags.VISIBLE)) != 0
        collides = (flags & int(ShapeFlags.COLLIDE_SHAPES)) != 0
        if torch.device(device).type == "cpu" and (seen == collides)[(flags & int(ShapeFlags.SITE)) == 0].all():
            for name, cam in self.cfgs.items():
                if list(cam.channels) == ["depth"]:
                    self._set_multiray(name)

        self._steps = torch.zeros((), dtype=torch.long)  # control steps so far (on the host: read freely)
        self._refitted = -1
        self._poses = wp.zeros(n, dtype=wp.transformf, device=device)
        self._poses_t = wp.to_torch(self._poses)  # (n, 7): position, quaternion (x, y, z, w)
        self._world = torch.arange(n, dtype=torch.int32, device=device)
        self._skip = torch.full_like(self._world, int(SensorCamera.WorldRenderFlag.DISABLE_PRESERVE))
        self._world_indices = wp.from_torch(torch.empty_like(self._world), dtype=wp.int32)

    def __contains__(self, name: str) -> bool:
        return name in self.cfgs

    def _set_rays(self, name: str, fov: float) -> None:
        """Camera ``name``'s ray bundle, one for every world, for a vertical field of view ``fov`` [deg]."""
        from newton.sensors import SensorCamera

        cam = self.cfgs[name]
        self._rays[name] = SensorCamera.compute_camera_rays_pinhole(cam.width, cam.height, camera_fov=math.radians(fov),
                                                                    device=self.sim.device)
        self._render_fov[name] = fov

    def _set_multiray(self, name: str) -> None:
        """The rays of :meth:`_set_rays` as mj_multiRay casts them: (H W, 3) unit vectors in our camera frame."""
        rays = wp.to_torch(self._rays[name])[:, :, 0, 1].reshape(-1, 3).double()  # (H W, 3), GL frame
        rays = quat_rotate(self._gl.double().expand(len(rays), 4), rays)
        self._multiray[name] = (rays / rays.norm(dim=1, keepdim=True)).cpu().numpy()

    def set_fov(self, name: str, worlds: torch.Tensor, fov: torch.Tensor, max_fov: float) -> None:
        """Camera ``name`` in ``worlds`` (num_envs,) bool sees with a vertical field of view ``fov``
        (num_envs,) [deg], each <= ``max_fov``. One ray bundle serves every world, so the camera is
        rendered at the widest field of view asked for, and each world's image is that frame's centre
        enlarged to its own (nearest pixel for depth and segmentation, bilinear for RGB): the same
        pinhole at its field of view, at a little less resolution."""
        if not 0 < max_fov < 180:
            raise ValueError(f"camera '{name}': a field of view up to {max_fov} degrees; it must stay in (0, 180).")
        if max_fov > self._render_fov[name]:
            self._set_rays(name, max_fov)
            if name in self._multiray:
                self._set_multiray(name)
            self._due[name].fill_(True)
        self.fov[name].copy_(torch.where(worlds, fov.float(), self.fov[name]))
        self._jittered.add(name)

    def _zoomed(self, name: str, frame: torch.Tensor, mode: str) -> torch.Tensor:
        """``frame`` (num_envs, H, W[, 3]) rendered at the camera's render field of view, as each
        world's own field of view shows it (:meth:`set_fov`); as it is where they are the same."""
        if name not in self._jittered:
            return frame
        render = self._render_fov[name]
        n, h, w = frame.shape[:3]
        scale = torch.tan(torch.deg2rad(self.fov[name]) / 2) / math.tan(math.radians(render) / 2)  # (n,)
        ys = (torch.arange(h, device=frame.device) + 0.5) / h * 2 - 1  # pixel centres, [-1, 1]
        xs = (torch.arange(w, device=frame.device) + 0.5) / w * 2 - 1
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)  # (h, w, 2): x, y
        grid = grid.unsqueeze(0) * scale.view(n, 1, 1, 1)
        image = frame.unsqueeze(1) if frame.dim() == 3 else frame.permute(0, 3, 1, 2)
        zoomed = torch.nn.functional.grid_sample(image.float(), grid, mode=mode, align_corners=False)
        zoomed = zoomed.squeeze(1) if frame.dim() == 3 else zoomed.permute(0, 2, 3, 1)
        return zoomed.round().to(frame.dtype) if frame.dtype == torch.uint8 else zoomed.to(frame.dtype)

    def renderer(self, name: str) -> str:
        """What renders camera ``name``: "mj_multiRay" (the C backend, see the module docstring) or
        "SensorCamera"."""
        return "mj_multiRay" if name in self._multiray and self.sim.solver.backend == "c" else "SensorCamera"

    def tick(self) -> None:
        """After a control step: the cameras whose period came round are due in every world."""
        self._steps += 1
        self._ring_step += 1
        steps = int(self._steps)
        for name, cam in self.cfgs.items():
            if steps % cam.period == 0:
                self._due[name].fill_(True)

    def reset(self, worlds: torch.Tensor) -> None:
        """Worlds whose state was written (num_envs,) bool: every camera renders them again (and a
        late camera's past frames of them are forgotten: a new episode sees none of the last)."""
        for due in self._due.values():
            due |= worlds
        for fresh in self._fresh.values():
            fresh |= worlds
        self._pushed.clear()  # the next read brings the reset worlds' frames into the rings, within this step

    def set_latency(self, name: str, worlds: torch.Tensor, steps: torch.Tensor, max_steps: int) -> None:
        """The images of camera ``name`` in ``worlds`` (num_envs,) bool are read ``steps``
        (num_envs,) whole control steps late, each <= ``max_steps``."""
        size = max_steps + 1
        rings = self._past.get(name)
        if rings is None or size > len(next(iter(rings.values()))):
            n, cam = self.sim.num_envs, self.cfgs[name]
            shapes = {"depth": ((cam.height, cam.width), torch.float32),
                      "rgb": ((cam.height, cam.width, 3), torch.uint8),
                      "segmentation": ((cam.height, cam.width), torch.uint8)}
            self._past[name] = {c: torch.zeros(size, n, *shapes[c][0], dtype=shapes[c][1], device=self.sim.device)
                                for c in cam.channels}
            for c in cam.channels:  # a new ring holds no frames yet: filled with the next one
                self._fresh[(name, c)].fill_(True)
                self._pushed.pop((name, c), None)
        self.latency[name].copy_(torch.where(worlds, steps, self.latency[name]))

    def pose(self, name: str, gl: bool = True) -> torch.Tensor:
        """(num_envs, 7) the camera's pose in the world (position [m], quaternion x, y, z, w) in
        Newton's frame convention (looking along -z), or with ``gl=False`` in ours (along +x)."""
        pos, quat = self.mount_pos[name], self.mount_quat[name]
        if gl:
            quat = quat_mul(quat, self._gl.expand_as(quat))
        body = self._body[name]
        if body is None:
            return torch.cat([pos, quat], dim=-1)
        body_pose = self.sim.body_q[:, body]
        return torch.cat([body_pose[:, :3] + quat_rotate(body_pose[:, 3:], pos),
                          quat_mul(body_pose[:, 3:], quat)], dim=-1)

    def depth(self, name: str) -> torch.Tensor:
        """(num_envs, height, width) float32 planar depth [m]; 0 where nothing is within [near, far].
        The frame each world's latency makes it read (the newest without one)."""
        return self._late(name, "depth", self._zoomed(name, wp.to_torch(self._rendered(name, "depth")), "nearest"))

    def rgb(self, name: str) -> torch.Tensor:
        """(num_envs, height, width, 3) uint8 sRGB, late as :meth:`depth`."""
        rgb = wp.to_torch(self._rendered(name, "rgb")).view(torch.uint8).unflatten(-1, (-1, 4))[..., :3]
        return self._late(name, "rgb", self._zoomed(name, rgb, "bilinear"))

    def segmentation(self, name: str) -> torch.Tensor:
        """(num_envs, height, width) uint8 labels (:attr:`labels`), late as :meth:`depth`."""
        shape = wp.to_torch(self._rendered(name, "segmentation")).view(torch.int32)  # no surface: 0xFFFFFFFF, -1
        seen = (shape >= 0) & (shape < len(self._shape_label))
        labels = torch.where(seen, self._shape_label[shape.clamp(0, len(self._shape_label) - 1).long()], 0)
        return self._late(name, "segmentation", self._zoomed(name, labels.to(torch.uint8), "nearest"))

    def _late(self, name: str, channel: str, frame: torch.Tensor) -> torch.Tensor:
        """``frame`` (this step's) joins the camera's ring once per step; per world, the frame of
        ``latency`` steps ago (this one where the world was reset since)."""
        if name not in self._past:
            return frame
        ring, step = self._past[name][channel], int(self._steps)
        if self._pushed.get((name, channel)) != step:
            ring.index_copy_(0, (self._ring_step % len(ring)).view(1), frame.unsqueeze(0))
            fresh = self._fresh[(name, channel)]
            ring.copy_(torch.where(fresh.view(1, -1, *[1] * (frame.dim() - 1)), frame.unsqueeze(0), ring))
            fresh.fill_(False)
            self._pushed[(name, channel)] = step
        return ring[(self._ring_step - self.latency[name]) % len(ring), self._world.long()]

    def state_views(self) -> dict[str, torch.Tensor]:
        """What the cameras carry from step to step, as live views (a checkpoint's part of
        :meth:`NewtonSim.state_dict`): the drawn mounts, sensor errors and latencies, which worlds are
        due, the frames (a period > 1 shows the last one), a late camera's past frames, and the step
        count."""
        views: dict[str, torch.Tensor] = {"cameras.steps": self._steps}
        for name in self.cfgs:
            views |= {f"cameras.{name}.mount_pos": self.mount_pos[name], f"cameras.{name}.mount_quat":
                      self.mount_quat[name], f"cameras.{name}.due": self._due[name]}
            views |= {f"cameras.{name}.{k}": v for k, v in self.noise[name].items()}
            views[f"cameras.{name}.fov"] = self.fov[name]
            views |= {f"cameras.{name}.{c}": wp.to_torch(image) for c, image in self._images[name].items()}
            if name in self._past:  # a late camera (without: the state of a camera before latencies existed)
                views |= {f"cameras.{name}.latency": self.latency[name], "cameras.ring_step": self._ring_step}
                views |= {f"cameras.{name}.past_{c}": ring for c, ring in self._past[name].items()}
        return views

    def _rendered(self, name: str, channel: str) -> wp.array:
        images = self._images[name]
        if channel not in images:
            raise ValueError(f"camera '{name}' renders no {channel}: add it to task.scene.cameras.{name}.channels "
                             f"(now {list(self.cfgs[name].channels)}).")
        self._render(name)
        return images[channel]

    def _render(self, name: str) -> None:
        due = self._due[name]
        if torch.device(self.sim.device).type == "cpu" and not bool(due.any()):
            return
        cam, images = self.cfgs[name], self._images[name]
        if self.renderer(name) == "mj_multiRay":
            link = self.pose(name, gl=False).double().numpy()
            with self._lock:
                self.sim.solver.depth_images(self.sim.state, self.sim.control, link[:, :3].copy(), link[:, 3:].copy(),
                                             self._multiray[name], due.nonzero().squeeze(1).numpy(),
                                             wp.to_torch(images["depth"]).view(self.sim.num_envs, -1).numpy(), cam.far)
        else:
            self._poses_t.copy_(self.pose(name))
            torch.where(due, self._world, self._skip, out=wp.to_torch(self._world_indices))
            outputs = {"depth": "forward_depth_image", "rgb": "color_image", "segmentation": "shape_index_image"}
            channels = {outputs[c]: image for c, image in images.items()}
            with self._lock:
                version = self.sim.body_q._version
                if version != self._refitted:  # the shapes' bounds, once per new state for every camera
                    self.sim.model.bvh_refit_shapes(self.sim.state)
                    self._refitted = version
                self.sensor.update(self.sim.state, self._poses, self._rays[name],
                                   world_indices=self._world_indices, **channels)
        if "depth" in images:
            depth = wp.to_torch(images["depth"])
            depth.masked_fill_((depth < cam.near) | (depth > cam.far), 0.0)  # no return, as a depth camera
        due.fill_(False)
