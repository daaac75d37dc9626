"""The Python side of the optimizer-text conformance table (optimizer_texts.json): for each row,
the OptimizerSpec the Python client makes of it (pipetrain.optimizer_spec(optimizer,
lr_schedule), what create_job sends) as "ok <OptimizerSpec in text format>", or the client's own
error as "CODE | message", one line per row. optimizer_driver.cc reads these lines as the
coordinator reads the spec. Usage: optimizer_driver.py TABLE.json
"""

import json
import sys

from google.protobuf import text_format

import pipetrain


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        table = json.load(f)
    for row in table["rows"]:
        try:
            spec = pipetrain.optimizer_spec(row["optimizer"], row.get("lr_schedule"))
        except pipetrain.PipetrainError as e:
            print("%s | %s" % (e.code.name, e.message.replace("\n", " ")))
            continue
        except Exception as e:  # pylint: disable=broad-except
            # Any other exception is a client bug: shown as such, the other rows still run.
            print("EXCEPTION | %s: %s" % (type(e).__name__, str(e).replace("\n", " ")))
            continue
        # %.9g prints every float32 exactly.
        print("ok " + text_format.MessageToString(spec, as_one_line=True, float_format=".9g"))


if __name__ == "__main__":
    main()
