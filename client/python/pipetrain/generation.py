"""pipetrain.generate(): text continued by a language model, through the `pipetrain generate`
command — from a checkpoint in a local process, or from a running job's live weights through the
service (docs/python.md, "Generating text")."""

import subprocess

from pipetrain.errors import PipetrainError, StatusCode
from pipetrain.local import _find_binary

# The environment variable naming the CLI binary.
PIPETRAIN_BINARY_ENV = "PIPETRAIN_BINARY"


def generate(prompt, checkpoint=None, coordinator=None, job=None, data=None, data_dir=None,
             tokenizer=None, max_tokens=200, temperature=1.0, top_k=0, seed=0, pipetrain_binary=None,
             build_dir=None, timeout=600):
    """Continues the text `prompt` (str) and returns the prompt followed by the generated text,
    as `pipetrain generate` prints it (without its final newline):
      - checkpoint="DIR": from a checkpoint (`generate --resume DIR`), decoded in a local
        process; `data` names its text data set when the checkpoint does not;
      - coordinator="HOST:PORT", job="ID": from a running job's live weights through the service
        (`generate --coordinator --job`, the Generate RPC); `tokenizer` (the directory of the
        SentencePiece tokenizer the job was trained with) or else `data` (the text data set the
        job trains on, whose byte vocabulary maps the text) is required.
    Sampling: temperature (0: greedy), top_k (0: the whole vocabulary), seed — the same options
    give the same text either way for the same weights. The binary: pipetrain_binary, else
    $PIPETRAIN_BINARY, else build_dir/client/pipetrain, else `pipetrain` on PATH. Errors:
    PipetrainError INVALID_ARGUMENT for neither or both of checkpoint and job, else with the
    code the command names in its error (UNKNOWN if it names none)."""
    if (checkpoint is None) == (job is None):
        raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                             "generate() needs either checkpoint= or coordinator= and job=")
    binary = _find_binary("pipetrain", pipetrain_binary, PIPETRAIN_BINARY_ENV, build_dir,
                          "client", "pipetrain_binary")
    argv = [binary, "generate", "--prompt", str(prompt), "--max-tokens", str(int(max_tokens)),
            "--temperature", repr(float(temperature)), "--top-k", str(int(top_k)),
            "--seed", str(int(seed))]
    if checkpoint is not None:
        argv += ["--resume", str(checkpoint)]
    else:
        if not coordinator:
            raise PipetrainError(StatusCode.INVALID_ARGUMENT,
                                 "generate(job=...) needs coordinator=\"HOST:PORT\"")
        argv += ["--coordinator", str(coordinator), "--job", str(job)]
    if data is not None:
        argv += ["--data", str(data)]
    if data_dir is not None:
        argv += ["--data-dir", str(data_dir)]
    if tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer)]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if run.returncode != 0:
        message = run.stderr.strip() or "pipetrain generate exited with %d" % run.returncode
        code = StatusCode.UNKNOWN
        for candidate in StatusCode:
            if candidate != StatusCode.OK and candidate.name + ":" in message:
                code = candidate
                break
        raise PipetrainError(code, message, "generate")
    return run.stdout[:-1] if run.stdout.endswith("\n") else run.stdout
