"""What the drill's actions ASKED for, replayed: each backend's intended
state and base weight at any drill time, independent of what spillwayd
reports. The judge compares the balancer against this (a drain that a
restart silently lost must fail the drill, not move the goalposts), and
computes the expected shares of new flows from it.

Semantics (README, "Failover drills"; issue #10 for reload):
  * the configuration file is the base; operator actions are an overlay that
    survives restarts and reloads until an operator changes them;
  * `add` puts a backend in (active, the action's or the scenario's weight),
    also one that was in the starting configuration and was removed;
  * `remove` takes it out (it drains first; judged as removed);
  * `drain` / `undrain`, `disable` / `enable` set what the operator wants;
  * `weight` sets the base weight;
  * `kill` / `link-down` fail it until `start-servers` / `link-up`;
  * `reload` with an edit: backends the new file adds are in, backends it no
    longer names retire (drain, then removed) unless the operator added them
    at run time; the file's weights apply where the operator set none;
  * `discovery-write`: a discovery pool's file lists `listed` (in, as if
    the configuration file named them) and no longer `unlisted` (they retire
    like a reload's removal); the operator's overlay stays;
  * `restart-lb` changes no intent at all.

Intended states: "active", "draining", "disabled", "failed", "removed"
(was in, now out) or None (never in yet).
"""

# States that take no new flows.
NO_NEW_FLOWS = {"draining", "disabled", "failed", "removed", None}

INTENT_ACTIONS = {"add", "remove", "drain", "undrain", "disable", "enable", "weight", "kill",
                  "link-down", "start-servers", "link-up", "reload", "discovery-write"}


class Backend:
    def __init__(self, name):
        self.name = name
        self.in_file = False
        self.file_weight = 100
        self.added = False      # operator `add` (the overlay keeps it across reloads)
        self.removed = False    # operator `remove`
        self.admin = "active"   # operator drain / disable
        self.rt_weight = None   # operator `weight`
        self.failed = False
        self.ever = False       # was ever in

    def present(self):
        return (self.in_file or self.added) and not self.removed

    def state(self):
        if not self.present():
            return "removed" if self.ever else None
        if self.failed:
            return "failed"
        return self.admin

    def weight(self):
        return self.rt_weight if self.rt_weight is not None else self.file_weight


class Intent:
    """start_members: the backends in the starting configuration; weights:
    the scenario's base weights (default 100); actions: the drill's action
    records ({"t", "do", "target", ...}, as runner.Drill.actions keeps them)."""

    def __init__(self, names, start_members, weights, actions):
        self.names = sorted(names)
        self.start_members = set(start_members)
        self.weights = dict(weights)
        self.actions = sorted([a for a in actions if a["do"] in INTENT_ACTIONS],
                              key=lambda a: a["t"])

    def _replay(self, until):
        bs = {n: Backend(n) for n in self.names}
        for n in self.start_members:
            b = bs[n]
            b.in_file, b.ever = True, True
            b.file_weight = self.weights.get(n, 100)
        for a in self.actions:
            if a["t"] > until:
                break
            do, b = a["do"], bs.get(a.get("target"))
            if do == "add":
                b.added, b.removed, b.ever = True, False, True
                b.admin, b.failed = "active", False
                b.rt_weight = a.get("weight", self.weights.get(b.name, 100))
            elif do == "remove":
                b.removed, b.added = True, False
            elif do == "drain":
                b.admin = "draining"
            elif do == "disable":
                b.admin = "disabled"
            elif do in ("undrain", "enable"):
                b.admin = "active"
            elif do == "weight":
                b.rt_weight = a["weight"]
            elif do in ("kill", "link-down"):
                b.failed = True
            elif do in ("start-servers", "link-up"):
                b.failed = False
            elif do == "reload":
                for n in a.get("add", []):
                    x = bs[n]
                    x.in_file, x.ever = True, True
                    if not x.added:
                        x.removed = False
                for n in a.get("remove", []):
                    bs[n].in_file = False
                for n, w in a.get("weights", {}).items():
                    bs[n].file_weight = w
            elif do == "discovery-write":
                # A discovery pool's file: its listed backends are in (as
                # the configuration file's are), the others retire; an
                # operator's removal is not undone by a listing.
                for n in a.get("listed", []):
                    bs[n].in_file, bs[n].ever = True, True
                for n in a.get("unlisted", []):
                    bs[n].in_file = False
        return bs

    def states(self, t):
        """name -> intended state at drill time t (unix seconds, like the
        action records' "t")."""
        return {n: b.state() for n, b in self._replay(t).items()}

    def weights_at(self, t):
        """name -> intended base weight at time t (backends that are in)."""
        return {n: b.weight() for n, b in self._replay(t).items() if b.present()}

    def last_change(self, name, t):
        """The time of the last action at or before t that changed the
        intent for `name` (a reload counts for every backend), or None."""
        last = None
        for a in self.actions:
            if a["t"] > t:
                break
            if a.get("target") == name or a["do"] == "reload" or \
                    name in a.get("changed", []):
                last = a["t"]
        return last

    def intervals(self, name, t_start, t_end):
        """[(from, to, state)] of the backend's intended state over
        [t_start, t_end], split at every action that changed it."""
        cuts = [t_start] + [a["t"] for a in self.actions if t_start < a["t"] < t_end and
                            (a.get("target") == name or a["do"] == "reload" or
                             name in a.get("changed", []))] + [t_end]
        out = []
        for lo, hi in zip(cuts, cuts[1:]):
            s = self.states(lo)[name]
            if out and out[-1][2] == s:
                out[-1] = (out[-1][0], hi, s)
            else:
                out.append((lo, hi, s))
        return out


# What spillwayd may report for each intended state (the control plane's
# effective states). A backend that health failed while the operator wants it
# active is a deviation: the intent check names it.
REPORTED_OK = {
    "active": {"active"},
    "draining": {"draining", "removed", None},
    "disabled": {"disabled"},
    "failed": {"failed", "active", "draining", "disabled", "removed", None},
    "removed": {"draining", "removed", None},
    None: {None, "removed"},
}
