"""Plays a conformance scenario's actions with the Python client (pipetrain.Client / Job) against
the coordinator at ADDRESS and prints what the client observed, one line per action (and indented
lines for the waits, pauses and recoveries of a recovery), in the form session_driver.cc prints
for the C++ SDK. Usage: session_driver.py SCENARIO.json ADDRESS

Lines: "ACTION -> RESULT" where RESULT is "ok", "step S loss L" (L as %.9g), "step S" (a
checkpoint or its retry), a number, a directory or "none" (failed_checkpoint), or "CODE | message"
for an error; "  wait CODE" (on_wait), "  pause Nms"
(each pause between two GetJob polls, also really made), "  recovered from step R (CAUSE)"
(on_recovery).
"""

import inspect
import json
import sys
import time

import numpy as np

import pipetrain
import pipetrain.client
from pipetrain import PipetrainError

MODEL = "layers { linear { in_features: 1 out_features: 1 } } loss { mse {} }"


def out(line):
    print(line, flush=True)


def pause(seconds):
    out("  pause %dms" % round(seconds * 1000))
    time.sleep(seconds)


def error(e):
    return "%s | %s" % (e.code.name, e.message)


def step_line(r):
    return "step %d loss %.9g" % (r.step, r.loss)


def seconds(value):
    return "%gs" % value


def defaults():
    """The replay options' defaults, as create_job and Job take them."""
    create = inspect.signature(pipetrain.Client.create_job).parameters
    job = inspect.signature(pipetrain.Job.__init__).parameters
    names = ("max_kept_batches", "recovery_timeout", "reconnect_timeout", "max_poll_interval")
    for name in names:
        assert create[name].default == job[name].default, name
    client = inspect.signature(pipetrain.Client.__init__).parameters
    return ("max_kept_batches %d, recovery_timeout %s, reconnect_timeout %s, max_poll_interval %s, "
            "rounds %d; connect_timeout %s, call_timeout %s, long_call_timeout %s, keepalive %s/%s"
            % (job["max_kept_batches"].default, seconds(job["recovery_timeout"].default),
               seconds(job["reconnect_timeout"].default),
               seconds(job["max_poll_interval"].default), pipetrain.client._RECOVERY_ROUNDS,
               seconds(client["connect_timeout"].default), seconds(client["timeout"].default),
               seconds(client["long_timeout"].default), seconds(client["keepalive"].default),
               seconds(client["keepalive"].default)))


def batch(tag):
    return np.zeros((tag, 1), dtype=np.float32), np.zeros((tag, 1), dtype=np.float32)


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        scenario = json.load(f)
    address = sys.argv[2]
    pipetrain.client._sleep = pause
    client = None
    job = None
    left = False
    for action in scenario["actions"]:
        (name, arg), = action.items()
        label = name if not isinstance(arg, int) else "%s %d" % (name, arg)
        # "leave" ends the Job's scope; the actions of the job alone still have it.
        of_the_job = name in ("finish", "retry", "failed_checkpoint")
        if (name not in ("defaults", "connect") and client is None) or \
                (name not in ("defaults", "connect", "create")
                 and (job is None or (left and not of_the_job))):
            out("%s -> FAILED_PRECONDITION | the scenario has no %s"
                % (label, "connection" if client is None else "job"))
            continue
        try:
            if name == "defaults":
                out("defaults -> " + defaults())
            elif name == "connect":
                keepalive = arg.get("keepalive_s", 5.0)
                client = pipetrain.Client(address, connect_timeout=10, keepalive=keepalive)
                out("connect -> ok")
            elif name == "create":
                options = dict(arg.get("options", {}))
                kwargs = {}
                for key in ("max_kept_batches",):
                    if key in options:
                        kwargs[key] = options.pop(key)
                for key in ("recovery_timeout", "reconnect_timeout", "max_poll_interval"):
                    if key + "_s" in options:
                        kwargs[key] = options.pop(key + "_s")
                assert not options, options
                if "save_to" in arg:
                    kwargs["save_to"] = arg["save_to"]
                    kwargs["keep_checkpoints"] = arg.get("keep", 0)
                job = client.create_job(
                    model=MODEL, recover=arg.get("recover", True),
                    on_wait=lambda e: out("  wait %s" % e.code.name),
                    on_recovery=lambda r: out("  recovered from step %d (%s)"
                                              % (r.restored_step, r.cause)),
                    on_shape_change=lambda c: out("  grew from %d to %d stages after step %d"
                                                  % (c.stages_before, c.stages, c.step)),
                    **kwargs)
                out("create -> ok")
            elif name == "step":
                out("step %d -> %s" % (arg, step_line(job.step(*batch(arg)))))
            elif name == "send":
                job.send(*batch(arg))
                out("send %d -> ok" % arg)
            elif name == "receive":
                out("receive -> %s" % step_line(job.receive()))
            elif name == "checkpoint":
                response = job.checkpoint("/ckpt", keep=arg.get("keep", 1),
                                          data_position=arg.get("position"))
                out("checkpoint -> step %d" % response.step)
            elif name == "failed_checkpoint":
                out("failed_checkpoint -> %s" % (job.failed_checkpoint or "none"))
            elif name == "leave":
                # As a `with` block left by an exception.
                stopped = RuntimeError("the program stopped")
                job.__exit__(type(stopped), stopped, None)
                left = True
                out("leave -> ok")
            elif name == "retry":
                response = job.checkpoint("/ckpt", keep=arg.get("keep", 1))
                out("retry -> step %d" % response.step)
            elif name == "kept":
                out("kept -> %d" % job.kept_batches)
            elif name == "in_flight":
                out("in_flight -> %d" % job.in_flight)
            elif name == "finish":
                status = job.finish()
                state = pipetrain.client.pb.JobState.Name(status.state)
                out("finish -> %s" % state.replace("JOB_STATE_", ""))
            else:
                raise ValueError("unknown action %r" % name)
        except PipetrainError as e:
            out("%s -> %s" % (label, error(e)))
    if client is not None:
        client.close()


if __name__ == "__main__":
    main()
