"""TensorFlow's coordination service heartbeat, for unchanged multi-worker scripts on loaded nodes.

tf.distribute.MultiWorkerMirroredStrategy starts TensorFlow's coordination service, which ends the
whole job when a worker sends no heartbeat for 10 s (kDefaultHeartbeatTimeoutMs in TensorFlow's
coordination_service.cc: a strategy built with no coordination config gets that default). On a
node shared with other work (a login node, an oversubscribed test cluster) a worker starved of CPU
for 10 s is not a dead worker, yet the job dies with "Task /job:worker/replica:0/task:0 heartbeat
timeout". TensorFlow reads no environment variable for this timeout; a script can pass it only
through context.configure_coordination_service, which an unchanged script does not call.

So the image's envbuilder.pth calls install() at interpreter start-up (PTH_LINE). It does nothing unless
ENVBUILDER_TF_HEARTBEAT_S holds a positive whole number of seconds (job.sbatch of a tf-multiworker
job exports it, DEFAULT_S unless the job's environment says otherwise; the smoke suite's TF runs too).
Then, once TensorFlow's eager context module is imported, a coordination config made without a
heartbeat timeout gets that one; a timeout the script sets itself is kept. Standard library only.
"""

import os
import sys

ENV = "ENVBUILDER_TF_HEARTBEAT_S"
DEFAULT_S = 60          # what job.sbatch and the suite's TF runs set when the job's environment does not
# the line envbuilder.pth carries in a TensorFlow image (site runs a .pth line that starts with "import")
PTH_LINE = "import envbuilder_smoke.tf_coordination as h; h.install()"
TARGET = "tensorflow.python.eager.context"
# configure_coordination_service(self, service_type, service_leader, enable_health_check,
#     cluster_register_timeout_in_ms, heartbeat_timeout_in_ms, ...): its place after service_type
_POSITION = 3


def heartbeat_ms(environ=None):
    """The timeout asked for, in ms, or 0 (TensorFlow's own default stays)."""
    raw = (environ if environ is not None else os.environ).get(ENV, "").strip()
    if not raw.isdigit() or len(raw) > 6:
        return 0
    return int(raw) * 1000


def patch(module, ms):
    """Give Context.configure_coordination_service a default heartbeat timeout of MS."""
    cls = getattr(module, "Context", None)
    original = getattr(cls, "configure_coordination_service", None)
    if original is None or getattr(original, "_envbuilder_heartbeat", None) is not None:
        return False

    def configure_coordination_service(self, service_type, *args, **kwargs):
        if len(args) > _POSITION:
            if not args[_POSITION]:
                args = args[:_POSITION] + (ms,) + args[_POSITION + 1:]
        elif not kwargs.get("heartbeat_timeout_in_ms"):
            kwargs["heartbeat_timeout_in_ms"] = ms
        return original(self, service_type, *args, **kwargs)

    configure_coordination_service._envbuilder_heartbeat = ms
    configure_coordination_service.__doc__ = original.__doc__
    cls.configure_coordination_service = configure_coordination_service
    return True


class _Finder(object):
    """A meta path finder that only wraps the loading of TARGET (then removes itself)."""

    def __init__(self, ms):
        self.ms = ms

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        import importlib.machinery
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        loader = getattr(spec, "loader", None)
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec
        ms = self.ms

        def exec_module(module):
            run(module)
            try:
                patch(module, ms)
            except Exception:  # noqa: BLE001 - TensorFlow's own behaviour stays
                pass

        loader.exec_module = exec_module
        return spec


def install(environ=None):
    """The .pth's call (PTH_LINE): wrap TensorFlow's loading when a timeout is asked for. Never raises:
    a start-up hook must not break an interpreter."""
    try:
        ms = heartbeat_ms(environ)
        if not ms or TARGET in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
            return False
        sys.meta_path.insert(0, _Finder(ms))
        return True
    except Exception:  # noqa: BLE001
        return False

