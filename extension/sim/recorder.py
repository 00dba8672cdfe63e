"""What a replay measures while it runs: GPU figures integrated over simulated time.

The loop (``replay.py``) tells the recorder every change of demand (``add_demand``) and of the
GPUs a job holds or computes on (``change``); before each instant it integrates the figures
over the span since the previous one (``advance``: nothing changed within it), and after the
decisions it takes the deserved shares and a timeline point (``observe``). What the figures
mean is in docs/simulate.md "Metrics". With a ``SegmentLog`` in ``segments`` every change is
also told to it (``wmla simulate --jobs-csv``).
"""

from __future__ import annotations

from .deserved import DeservedNow
from .jobs import ReplayJob
from .metrics import EPS, PlanShape, num
from .scenario import Scenario
from .segments import SegmentLog


class Recorder:
    """Integrates the figures over time; ``observe(now)`` closes the span since the last call.

    Contention: the total GPU demand (max request of every pending and running job) is above
    the capacity. Fairness: |held - deserved| GPUs per plan, time-averaged, per depth of the
    plan tree (1: teams, 2: user leaves for a trace). Share deviation: at every moment the mean
    of |held - deserved| GPUs over the plans with demand then, time-averaged. Held GPU-seconds
    per plan: what the plan's jobs held (any worker bound, terminating victims included).
    """

    def __init__(self, scenario: Scenario, capacity: float) -> None:
        self.capacity = capacity
        plans = [(p.path, p.share, p.limit.gpu) for p in scenario.plans]
        self.shape = PlanShape(plans)
        self.teams = sorted(p for p in self.shape.paths if p.count("/") == 1)
        self.team_index = {t[1:]: i for i, t in enumerate(self.teams)}
        self.leaf_held: dict[str, float] = {}
        # GPUs held per plan, leaves summed up; a plan holding none has no entry, so the
        # integration passes over the plans that hold some only
        self.held_by_plan: dict[str, float] = {}
        self.leaf_demand: dict[str, float] = {}
        self.shares = DeservedNow(self.shape, self.leaf_demand, capacity)
        # |held - deserved| GPUs of every plan where it is not 0, brought up to date before each
        # integration for the plans whose held or deserved GPUs changed (``gaps_stale``), so
        # that the integration passes over these plans only
        self.gaps: dict[str, float] = {}
        self.gaps_stale: set[str] = set()
        self.position: dict[str, int] = {}  # plan -> its place in shape.paths
        self.ancestry: dict[str, tuple[tuple[str, ...], int | None]] = {}  # leaf -> see _line
        self.team_held = [0.0] * len(self.teams)
        self.held = 0.0
        self.busy = 0.0
        self.demand = 0.0
        self.last_t: float = 0.0
        self.first_t: float | None = None
        self.deserved_stale = True
        self.deadlocked = 0.0  # GPUs held by deadlocked jobs now (set by pod-fifo)
        # integrals (GPU-seconds or seconds)
        self.span = 0.0
        self.contended = 0.0
        self.held_contended = 0.0
        self.busy_contended = 0.0
        self.held_all = 0.0
        self.busy_all = 0.0
        self.wanted_all = 0.0
        self.partial_gs = 0.0
        self.deadlocked_gs = 0.0
        self.dev_all: dict[str, float] = {}
        self.dev_contended: dict[str, float] = {}
        self.with_demand: list[str] = []  # plans (not the root) with GPU demand now
        self.wanting: set[str] = set()  # the same as a set
        self.demand_s = 0.0  # seconds in which some plan had demand
        self.dev_demand_gs = 0.0  # the integral of the mean gap over the plans with demand
        self.held_gs: dict[str, float] = {}  # GPU-seconds held per plan
        self.timeline: list[tuple[float, tuple[float, ...], float]] = []
        self._last_point: tuple | None = None
        self._point_moved = True  # team_held or demand changed since the last point
        self.segments: SegmentLog | None = None  # each job's run segments, when asked for

    def add_demand(self, job: ReplayJob, sign: int) -> None:
        leaf = job.leaf
        if leaf not in self.shape.share:
            self.shape.add(leaf)
        amount = sign * job.gpu * job.core.max_workers
        self.leaf_demand[leaf] = self.leaf_demand.get(leaf, 0.0) + amount
        self.demand += amount
        self.shares.touch(leaf)
        self.deserved_stale = True
        self._point_moved = True

    def change(self, job: ReplayJob, held: float, busy: float) -> None:
        if held:
            leaf = job.leaf
            self.leaf_held[leaf] = self.leaf_held.get(leaf, 0.0) + held
            line, team = self.ancestry.get(leaf) or self._line(job)
            by_plan = self.held_by_plan
            for path in line:  # every plan above the leaf holds it too
                gpus = by_plan.get(path, 0.0) + held
                if gpus:
                    by_plan[path] = gpus
                else:
                    del by_plan[path]
            self.gaps_stale.update(line)
            self.held += held
            if team is not None:
                self.team_held[team] += held
                self._point_moved = True
        self.busy += busy
        if self.segments is not None:  # its state and placement are already the new ones
            self.segments.seen(job, self.last_t)

    def _line(self, job: ReplayJob) -> tuple[tuple[str, ...], int | None]:
        """The leaf and every plan above it (not the root), and the job's team's place in
        ``teams``; kept per leaf once the shape knows the leaf."""
        line = []
        path = job.leaf
        while path != "/":
            line.append(path)
            path = path.rsplit("/", 1)[0] or "/"
        found = (tuple(line), self.team_index.get(job.team))
        if job.leaf in self.shape.share:
            self.ancestry[job.leaf] = found
        return found

    def _update_gaps(self) -> None:
        """Bring ``gaps`` up to date for the plans whose held or deserved GPUs changed (the
        plans of the shape; the root is none)."""
        share, held, deserved, gaps = (
            self.shape.share,
            self.held_by_plan,
            self.shares.deserved,
            self.gaps,
        )
        for path in self.gaps_stale:
            if path in share:
                gap = abs(held.get(path, 0.0) - deserved.get(path, 0.0))
                if gap:
                    gaps[path] = gap
                else:
                    gaps.pop(path, None)
        self.gaps_stale.clear()

    def advance(self, now: float) -> None:
        """Integrate the figures from the last instant to ``now`` with the state as it was."""
        if self.first_t is None:
            self.first_t = self.last_t = now
        dt = now - self.last_t
        if dt > 0:
            self._integrate(dt)
        self.last_t = now

    def observe(self, now: float) -> None:
        """The state after the decisions at ``now``: deserved shares, a timeline point."""
        if self.deserved_stale:
            self._update_shares()
        if not self._point_moved:
            return
        self._point_moved = False
        point = (tuple(self.team_held), self.demand)
        if point != self._last_point:
            self._last_point = point
            if self.timeline and self.timeline[-1][0] == now:
                self.timeline[-1] = (now, *point)
            else:
                self.timeline.append((now, *point))

    def _update_shares(self) -> None:
        """Deserved shares, the gaps and the plans with demand after demand changed."""
        self.deserved_stale = False
        wanted, deserved = self.shares.update()
        self.gaps_stale |= deserved
        demand = self.shares.demand
        if any((demand[p] > EPS) != (p in self.wanting) for p in wanted if p != "/"):
            self.with_demand = [p for p in self.shape.paths if demand.get(p, 0.0) > EPS]
            self.wanting = set(self.with_demand)
        if len(self.position) != len(self.shape.paths):
            self.position = {p: n for n, p in enumerate(self.shape.paths)}

    def _integrate(self, dt: float) -> None:
        if self.gaps_stale:
            self._update_gaps()
        self.span += dt
        contended = self.demand > self.capacity + EPS
        self.held_all += self.held * dt
        self.busy_all += self.busy * dt
        self.wanted_all += min(self.capacity, self.demand) * dt
        self.partial_gs += (self.held - self.busy) * dt
        self.deadlocked_gs += self.deadlocked * dt
        if contended:
            self.contended += dt
            self.held_contended += self.held * dt
            self.busy_contended += self.busy * dt
        dev_all, dev_contended = self.dev_all, self.dev_contended
        for path, gap in self.gaps.items():  # the plans whose gap is not 0
            gap *= dt
            if gap:
                dev_all[path] = dev_all.get(path, 0.0) + gap
                if contended:
                    dev_contended[path] = dev_contended.get(path, 0.0) + gap
        held_gs = self.held_gs
        for path, gpus in self.held_by_plan.items():  # the plans that hold some
            held_gs[path] = held_gs.get(path, 0.0) + gpus * dt
        if self.with_demand:
            self._integrate_wanting(dt)

    def _integrate_wanting(self, dt: float) -> None:
        """The mean gap over the plans with demand: a plan whose gap is 0 adds nothing to the
        sum (x + 0.0 is x), so only the others are summed, in the order of the full sum."""
        if self.gaps:
            wanting, position = self.wanting, self.position
            terms = sorted((position[p], g) for p, g in self.gaps.items() if p in wanting)
            if terms:
                gaps = sum(g for _, g in terms)
                self.dev_demand_gs += gaps / len(self.with_demand) * dt
        self.demand_s += dt

    def fairness(self) -> dict:
        """Per depth: the mean over plans of the time-averaged |held - deserved| GPUs, the worst
        plan, and every plan's figure; over contended time and over the whole replay."""
        out = {}
        depths = sorted({self.shape.depth(p) for p in self.shape.paths})
        for depth in depths:
            paths = [p for p in self.shape.paths if self.shape.depth(p) == depth]
            level = {}
            for key, gs, span in (
                ("contended", self.dev_contended, self.contended),
                ("whole", self.dev_all, self.span),
            ):
                per = {p: (gs.get(p, 0.0) / span if span else 0.0) for p in paths}
                worst = max(paths, key=lambda p: (per[p], p)) if paths else None
                level[key] = {
                    "mean_abs_dev_gpu": num(sum(per.values()) / len(paths)) if paths else 0,
                    "mean_abs_dev_share": (
                        num(sum(per.values()) / len(paths) / self.capacity) if paths else 0
                    ),
                    "worst_plan": worst,
                    "plans": {p: num(per[p]) for p in sorted(paths)},
                }
            out[str(depth)] = level
        return out

    def share_deviation(self) -> dict:
        """The time-weighted mean over the plans with demand (every depth, not the root) of
        |held - deserved| GPUs, over the time some plan had demand; ``mean_abs_dev_share`` is
        the same over the capacity."""
        mean = self.dev_demand_gs / self.demand_s if self.demand_s else 0.0
        return {
            "mean_abs_dev_gpu": num(mean),
            "mean_abs_dev_share": round(mean / self.capacity, 6) if self.capacity else 0,
            "over_s": num(self.demand_s),
        }

    def held_gpu_s(self) -> dict:
        """GPU-seconds held in all and per plan (every plan that held any, not the root)."""
        return {
            "total": num(self.held_all),
            "plans": {p: num(v) for p, v in sorted(self.held_gs.items())},
        }
