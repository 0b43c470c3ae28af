"""Running a plan on two hosts: the per-run runner, the iperf3/dd baselines and the hosts' metadata."""
import json
from typing import Optional, Union


def json_object(line: Union[str, bytes]) -> Optional[dict]:
    """The JSON object one output line holds, else None (another value, or not JSON: a line of a log)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
