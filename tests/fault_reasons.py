"""Why each injected fault's reply is left out, as the log and ``metrics.jsonl`` say it (regular expressions)."""

from __future__ import annotations

import re

from fedweigh.faults import EXTRA_TENSOR

REASON = {  # why each fault's reply is left out, as the log and metrics.jsonl say it
    "exception": r"the ClientApp failed: .*fault injection: partition \d+ raises in round \d+",
    "stall": r"no reply before the round's timeout",
    "nan": r"NaN or infinite",
    "inf": r"NaN or infinite",
    "wrong-shape": r"has shape \(\d+,\), expected",
    "wrong-dtype": r"has dtype float64, expected float32",
    "missing-tensor": r"missing \['[\w.]+'\], unexpected \[\]",
    "extra-tensor": rf"missing \[\], unexpected \['{re.escape(EXTRA_TENSOR)}'\]",
    "signal-missing": r"metric '[\w-]+' is missing",
    "signal-nan": r"metric '[\w-]+' = nan fails",
    "signal-negative": r"metric '[\w-]+' = -1.0 fails",
    "signal-range": r"metric '[\w-]+' = (1.5|-1.0|inf) fails",
    "old-round": r"trained the model of round \d+, 1 round\(s\) old",
    "duplicate": r"a second reply to the same instruction",
}
