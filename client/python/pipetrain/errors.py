"""The package's one exception type: every failure, the coordinator's or the client's own,
carries a gRPC status code and a message saying what was wrong and where."""

import grpc

StatusCode = grpc.StatusCode


class PipetrainError(Exception):
    """A failed call or a refused argument.

    Attributes:
      code: grpc.StatusCode, meaning what the coordinator's codes mean (coordinator.proto):
        INVALID_ARGUMENT a bad spec or batch, FAILED_PRECONDITION the wrong job state or too few
        workers, NOT_FOUND an unknown job, ABORTED a job recovering from a lost worker,
        UNAVAILABLE a coordinator that cannot be reached or stopped answering, DEADLINE_EXCEEDED
        a call that took longer than its deadline, CANCELLED a cancelled job,
        UNAUTHENTICATED / PERMISSION_DENIED a missing token or a path outside the checkpoint root.
      message: the coordinator's message (or the client's), unchanged.
      method: the RPC that failed ("CreateJob", "Train", ...), or "" for a client-side check.
    """

    def __init__(self, code, message, method=""):
        self.code = code
        self.message = message
        self.method = method
        text = "%s: %s" % (method, message) if method else message
        super().__init__("%s [%s]" % (text, code.name))

    @classmethod
    def from_rpc_error(cls, error, method, target):
        """The PipetrainError of a failed gRPC call `method` to the coordinator at `target`."""
        code = error.code() if hasattr(error, "code") else StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        if code == StatusCode.DEADLINE_EXCEEDED and (details or "") == "Deadline Exceeded":
            details = "the coordinator at %s did not answer in time" % target
        elif code == StatusCode.UNAVAILABLE and "keepalive" in (details or "").lower():
            details = "the coordinator at %s stopped answering (%s)" % (target, details)
        return cls(code, details or code.name, method)
