"""Read inputs.json, print a greeting, write it as an artifact, report outputs in result.json."""

import json
import os
from pathlib import Path

inputs = json.loads(Path("inputs.json").read_text())
greeting = " ".join([f"Hello, {inputs['name']}!"] * inputs["times"])
print(greeting)

out = Path(os.environ["FLOOM_OUTPUT_DIR"])
(out / "greeting.txt").write_text(greeting + "\n")

Path("result.json").write_text(
    json.dumps({"outputs": {"greeting": greeting, "length": len(greeting)}})
)
