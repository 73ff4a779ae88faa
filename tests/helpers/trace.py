"""Reading a Chrome-trace document: its processes' names and its timeline."""


def names(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def timeline(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] != "M"]
