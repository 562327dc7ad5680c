"""Watch the robot in a browser: a live 3-D view of an env (``legion play viewer=web``, ``legion
replay viewer=web``) and a replay saved as one HTML file that opens from disk (``html=true``).

The view is Newton's :class:`newton.viewer.ViewerViser`: a `viser <https://viser.studio>`_ web
server whose browser client ships inside the viser wheel, so nothing is downloaded, and which
binds 127.0.0.1 unless told otherwise. Its own panel pauses, steps and shows collision shapes;
:class:`WebViewer` adds what a robotics engineer steers while a policy runs: playback speed, the
env the camera follows, the command (a slider per component, and a draggable goal for position
commands), observation noise, randomization at resets, resetting the followed env, and
reloading the newest checkpoint of a run that is still training.

Browser events arrive on viser's thread; they are queued and applied on the simulation thread
between control steps (:meth:`WebViewer.apply_requests`), so the env is only touched by its own
thread.
"""

from __future__ import annotations

import base64
import queue
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from legion import StopRequests
from legion.tasks.env import LegionEnv
from legion.tasks.mdp.commands import PositionCommand

CAMERA_OFFSET = np.array([-1.6, -1.6, 0.9])  # where the camera sits from the followed robot [m]


class WebViewer:
    """A live view of ``env``'s worlds in the browser, with controls (see the module docstring).

    Args:
        env: the env to draw (its Newton model and state).
        host, port: where the server listens (default loopback only; ``0.0.0.0`` for every interface).
        title: the browser tab's title.
        reload: called by the "Reload newest checkpoint" button; returns a line saying what it
            loaded (``None``: no such button, e.g. a replay).
        record_to: also record every shown frame into this ``.viser`` file (see :func:`write_html`).
        controls: add the legion panel (a recording for a file has none).
    """

    def __init__(self, env: LegionEnv, host: str = "127.0.0.1", port: int = 8080, title: str = "legion-rl",
                 reload: Callable[[], str] | None = None, record_to: Path | None = None, controls: bool = True):
        import newton
        from newton.viewer import ViewerViser

        self.env = env
        self.viewer = ViewerViser(host=host, port=port, label=title, verbose=False,
                                  record_to_viser=str(record_to) if record_to else None)
        self.server = self.viewer.server
        self.viewer.set_model(env.sim.model)
        # Bodies drawn by their collision shapes alone (MJCF geoms that collide, e.g. the authored
        # quadruped's legs, carry no visual flag in Newton): show collision shapes too.
        model = env.sim.model
        assert model.shape_flags is not None and model.shape_body is not None
        flags, bodies = model.shape_flags.numpy(), model.shape_body.numpy()
        drawn = set(bodies[(flags & int(newton.ShapeFlags.VISIBLE)) != 0].tolist())
        self.viewer.show_collision = bool(set(bodies[bodies >= 0].tolist()) - drawn)
        self.url = f"http://{host}:{self.server.get_port()}"
        self.follow, self.speed, self.time = 0, 1.0, 0.0
        self._goal = None  # a position command's draggable goal, and the command
        self._requests: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        # a frame and close() one at a time: a close from another thread (an API user's, a test's)
        # waits for the frame in progress, and no frame is drawn into the stopped server after it
        self._drawing = threading.Lock()
        self._last_frame = time.perf_counter()
        self._target: np.ndarray | None = None  # the followed root where the cameras last looked at it
        self.viewer.set_visible_worlds([0])
        self.viewer.set_reset_callback(self._reset_followed)  # its "Reset" button: the followed env
        if controls:
            self._add_controls(reload)
        self._views = {}  # the scene's cameras: what each sees in the followed env
        cameras = env.sim.cameras
        if cameras is not None:
            with self.server.gui.add_folder("Cameras", order=1.0):
                self._views = {name: self.server.gui.add_image(self._picture(name), label=name, format="png")
                               for name in cameras.cfgs}
        self.server.on_client_connect(lambda client: self._aim(client, snap=True))

    # --- the panel --------------------------------------------------------------------------------
    def _add_controls(self, reload: Callable[[], str] | None) -> None:
        gui, env = self.server.gui, self.env
        with gui.add_folder("legion-rl", order=-1.0):
            speed = gui.add_slider("Speed (x real time)", min=0.1, max=4.0, step=0.1, initial_value=1.0)
            speed.on_update(lambda _: setattr(self, "speed", float(speed.value)))
            if env.num_envs > 1:
                follow = gui.add_slider("Follow env", min=0, max=env.num_envs - 1, step=1, initial_value=0)
                follow.on_update(lambda _: self._request(lambda: self.set_follow(int(follow.value))))
            noise = gui.add_checkbox("Observation noise", initial_value=env.noise_enabled)
            noise.on_update(lambda _: self._request(lambda: setattr(env, "noise_enabled", bool(noise.value))))
            randomized = [t for t in env.events.terms.values() if t.enabled and t.mode != "startup"]
            if randomized:
                randomize = gui.add_checkbox("Randomize at resets", initial_value=True,
                                             hint=", ".join(t.name for t in randomized))

                def set_randomized() -> None:
                    for term in randomized:
                        term.enabled = bool(randomize.value)

                randomize.on_update(lambda _: self._request(set_randomized))
            if reload is not None:
                status = gui.add_markdown("")
                button = gui.add_button("Reload newest checkpoint")
                button.on_click(lambda _: self._request(lambda: setattr(status, "content", reload())))
        if env.command is not None:
            self._add_command_controls()

    def _add_command_controls(self) -> None:
        """A slider per command component, within the task's ranges; moving one holds every env's
        command at the sliders' values until "Sample commands" lets the task draw them again."""
        gui, command = self.server.gui, self.env.command
        assert command is not None
        with gui.add_folder("Command", order=0.5):
            sliders = []
            for name, (low, high) in zip(command.COMPONENTS, command.ranges.tolist()):
                low, high = (low, high) if high > low else (low - 1.0, high + 1.0)
                initial = float(np.clip(0.0, low, high))
                sliders.append(gui.add_slider(name, min=low, max=high, step=(high - low) / 100, initial_value=initial))
            release = gui.add_button("Sample commands")

        def hold(_):
            self._request(lambda: self.hold_command([float(s.value) for s in sliders]))

        for slider in sliders:
            slider.on_update(hold)
        release.on_click(lambda _: self._request(command.release))
        if isinstance(command, PositionCommand):  # a goal to drag in the scene
            goal = self.server.scene.add_transform_controls("/goal", scale=0.15, disable_rotations=True)
            self._goal = (goal, command)

            def drag(_):
                self._request(lambda: self._hold_goal(command, np.asarray(goal.position), sliders))

            goal.on_update(drag)

    def _hold_goal(self, command: PositionCommand, position_w: np.ndarray, sliders) -> None:
        from legion.tasks.math import quat_rotate_inverse

        base_pos, base_quat = command.base_pose_w()
        target = torch.as_tensor(position_w, dtype=torch.float32, device=self.env.device)
        value = command.value.clone()
        value[:, :3] = quat_rotate_inverse(base_quat, target - base_pos)
        self.hold_command(value)
        for slider, v in zip(sliders, value[self.follow, :3].tolist()):
            slider.value = v

    def _request(self, change: Callable[[], None]) -> None:
        self._requests.put(change)

    # --- what the controls do (the simulation thread) ---------------------------------------------
    def apply_requests(self) -> bool:
        """Applies the browser's changes queued since the last call; True if any (the caller
        recomputes the observations: a held command or a reset changed them)."""
        changed = False
        while True:
            try:
                change = self._requests.get_nowait()
            except queue.Empty:
                return changed
            change()
            changed = True

    def hold_command(self, value) -> None:
        """Holds the command at ``value`` ((dim,) for every env, or (num_envs, dim)); observations follow."""
        assert self.env.command is not None
        self.env.command.hold(value)
        self.env.refresh_observations()

    def set_follow(self, env_id: int) -> None:
        """Shows env ``env_id`` alone and points the camera at it."""
        self.follow = int(np.clip(env_id, 0, self.env.num_envs - 1))
        self.viewer.set_visible_worlds([self.follow])
        self._target = None
        for client in self.server.get_clients().values():
            self._aim(client, snap=True)

    def _reset_followed(self) -> None:
        mask = torch.zeros(self.env.num_envs, dtype=torch.bool, device=self.env.device)
        mask[self.follow] = True
        self.env._reset(mask)
        self.env.refresh_observations()

    # --- drawing ----------------------------------------------------------------------------------
    def _followed_position(self) -> np.ndarray:
        return self.env.robot.body_pos_w[self.follow, 0].detach().cpu().numpy().astype(np.float64)

    def _aim(self, client, snap: bool = False) -> None:
        """Points ``client``'s camera at the followed robot, from where the user has orbited and
        zoomed to (its position relative to the point it looks at); ``snap``: from the default offset."""
        target = self._followed_position()
        orbit = CAMERA_OFFSET if snap else np.asarray(client.camera.position) - np.asarray(client.camera.look_at)
        with client.atomic():  # position first: viser's position setter moves look_at along
            client.camera.position = target + orbit
            client.camera.look_at = target

    def should_step(self) -> bool:
        """False while the view is paused (its "Pause" box), True once per "Step" click."""
        return self.viewer.should_step()

    @property
    def running(self) -> bool:
        return self.viewer.is_running()

    def show(self, dt: float) -> None:
        """Draws the current state, ``dt`` seconds of simulated time after the previous frame."""
        with self._drawing:
            if self.running:
                self._draw(dt)

    def _draw(self, dt: float) -> None:
        self.time += dt
        target = self._followed_position()
        if self._target is None or np.abs(target - self._target).max() > 1e-3:
            with warnings.catch_warnings():  # a browser that just closed its tab: its camera is gone
                warnings.simplefilter("ignore", UserWarning)
                for client in self.server.get_clients().values():
                    self._aim(client)
            self._target = target
        if self._goal is not None:
            goal, command = self._goal
            goal.position = command.target_pos_w()[self.follow].cpu().numpy()
        self.viewer.begin_frame(self.time)
        self.viewer.log_state(self.env.sim.state)
        self.viewer.end_frame()
        for name, view in self._views.items():
            view.image = self._picture(name)

    def _picture(self, name: str) -> np.ndarray:
        """What camera ``name`` sees in the followed env (:func:`~legion.tasks.sim.camera.picture`)."""
        from legion.tasks.sim.camera import picture

        cameras = self.env.sim.cameras
        assert cameras is not None
        channels = cameras.cfgs[name].channels
        image = (cameras.rgb(name) if "rgb" in channels else cameras.depth(name) if "depth" in channels
                 else cameras.segmentation(name))
        return picture(image[self.follow]).cpu().numpy()

    def pace(self, dt: float) -> None:
        """Sleeps so that frames ``dt`` of simulated time apart are shown at the chosen speed."""
        due = self._last_frame + dt / self.speed
        time.sleep(max(0.0, due - time.perf_counter()))
        self._last_frame = time.perf_counter()

    def close(self) -> None:
        with self._drawing:
            self.viewer.close()


def watch_policy(loaded, host: str = "127.0.0.1", port: int = 8080, steps: int | None = None,
                 on_ready: Callable[[WebViewer], None] | None = None) -> WebViewer:
    """``legion play viewer=web``: runs the run's policy (deterministic) in the live viewer until the
    process is stopped (or for ``steps`` control steps); ``loaded`` is a :class:`legion.api.LoadedRun`."""
    from legion.agents.checkpoints import CheckpointError, latest_good_checkpoint

    env = loaded.env
    policy = loaded.runner.policy
    policy.eval()

    def reload() -> str:
        try:
            path, contents = latest_good_checkpoint(loaded.run)
        except CheckpointError as e:
            return f"not reloaded: {e}"
        if path == loaded.checkpoint:
            return f"{path.name} is still the newest"
        loaded.runner.load(path, contents, episodes=False)
        loaded.checkpoint = path
        print(f"[legion] viewer: reloaded {path}", flush=True)
        return f"loaded {path.name}"

    viewer = WebViewer(env, host, port, title=f"legion-rl: {loaded.cfg.task.name}", reload=reload)
    print(f"[legion] viewer at {viewer.url} ({loaded.checkpoint.name} on {env.num_envs} envs of "
          f"{loaded.cfg.task.name}); Ctrl-C stops", flush=True)
    if on_ready is not None:
        on_ready(viewer)
    obs, done = env.get_observations(), 0
    # Ctrl-C as a flag, not a KeyboardInterrupt that a Warp array's finalizer can swallow (legion.StopRequests)
    stop = StopRequests()
    try:
        with stop:
            while viewer.running and not stop.event.is_set() and (steps is None or done < steps):
                if viewer.apply_requests():
                    obs = env.get_observations()
                if viewer.should_step():
                    with torch.inference_mode():
                        obs, _, dones, _ = env.step(policy(obs))
                        policy.reset(dones)  # a recurrent policy's state ends with its episode
                    done += 1
                viewer.show(env.step_dt)
                viewer.pace(env.step_dt)
        stop.raise_if_requested()  # (the caller's KeyboardInterrupt)
    finally:
        viewer.close()
    return viewer


class ReplayView:
    """``legion replay viewer=web`` and ``html=true``: passed to the replay as its ``on_step``, it
    draws each replayed step live at real time (``live``; pausing and stepping hold the replay)
    and/or records it for :meth:`finish` to write as one HTML file (``html``). The view shows the
    first replayed episode; the others are one click away with a live view ("Follow env")."""

    def __init__(self, live: bool, html: bool, host: str = "127.0.0.1", port: int = 8080,
                 title: str = "legion-rl replay"):
        self.live, self.html, self.host, self.port, self.title = live, html, host, port, title
        self.out = Path(".")  # where finish() writes replay.html (the replay's out folder)
        self.view: WebViewer | None = None
        self.start = np.zeros(3)  # where the followed robot starts [m]

    def __call__(self, env: LegionEnv) -> None:
        if self.view is None:  # built with the replay's env, at its initial state
            self.out.mkdir(parents=True, exist_ok=True)
            self.view = WebViewer(env, self.host, self.port if self.live else 0, self.title, controls=self.live,
                                  record_to=self.out / ".replay.viser" if self.html else None)
            if self.live:
                print(f"[legion] viewer at {self.view.url}; the replay runs at real time", flush=True)
            self.view.show(0.0)
            self.start = self.view._followed_position()
            return
        while self.live and self.view.running and not self.view.should_step():
            self.view.apply_requests()
            self.view.show(0.0)
            time.sleep(0.02)
        self.view.apply_requests()
        self.view.show(env.step_dt)
        if self.live:
            self.view.pace(env.step_dt)

    def finish(self) -> list[Path]:
        """Writes ``<out>/replay.html`` (if asked); returns what it wrote. A live view stays open
        (:meth:`serve_until_stopped`); a recording's server stops here."""
        if self.view is None or not self.html:
            return []
        recording = self.out / ".replay.viser"
        self.view.viewer.save_recording()
        data = recording.read_bytes()
        recording.unlink()
        if not self.live:
            self.close()
        # The file's camera does not follow: it looks at the start from twice the live view's distance.
        camera = (self.start + 2 * CAMERA_OFFSET, self.start)
        return [write_html(data, self.out / "replay.html", self.title, camera)]

    def serve_until_stopped(self) -> None:
        """Keeps the live view open on the last frame until Ctrl-C."""
        stop = StopRequests()
        try:
            with stop:
                while self.view is not None and self.view.running and not stop.event.is_set():
                    self.view.apply_requests()
                    self.view.show(0.0)
                    time.sleep(0.1)
        except KeyboardInterrupt:  # (a second Ctrl-C)
            pass
        self.close()

    def close(self) -> None:
        if self.view is not None:
            self.view.close()
            self.view = None


def write_html(recording: bytes, path: Path, title: str, camera: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """One HTML file that plays a ``.viser`` recording from disk, no server: viser's own client
    (one self-contained page in the viser wheel) with the recording inlined. A script before the
    client turns the inlined bytes into a blob URL and points the client's ``playbackPath`` at it;
    ``camera``: its initial (position, look-at point), z up."""
    import viser

    query = ""
    if camera is not None:
        position, look_at = (",".join(f"{v:.4g}" for v in np.asarray(c, dtype=float)) for c in camera)
        query = f"q.set('initialCameraPosition','{position}');q.set('initialCameraLookAt','{look_at}');" \
                "q.set('initialCameraUp','0,0,1');"

    client = (Path(viser.__file__).parent / "client" / "build" / "index.html").read_text()
    loader = (
        "<script>(function(){"
        f"var b=atob('{base64.b64encode(recording).decode()}'),a=new Uint8Array(b.length);"
        "for(var i=0;i<b.length;i++)a[i]=b.charCodeAt(i);"
        "var u=URL.createObjectURL(new Blob([a],{type:'application/octet-stream'}));"
        "var q=new URLSearchParams(location.search);q.set('playbackPath',u);" + query +
        "history.replaceState(null,'','?'+q.toString()+location.hash);"
        "})();</script>")
    head = client.index("<head>") + len("<head>")
    page = client[:head] + loader + client[head:].replace("<title>Viser</title>", f"<title>{title}</title>", 1)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page)
    tmp.replace(path)
    return path
