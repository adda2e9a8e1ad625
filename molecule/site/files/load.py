"""A steady load through the gateway while side_effect.yml re-provisions both boxes: a stream every second (the
boxes share this machine's two CPUs with the play) until the stop file exists, each recorded as a JSON line (HTTP
status, whether it ended with [DONE], what broke); OUT.done once it has stopped."""

import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request

OUT, STOP = sys.argv[1], sys.argv[2]
KEY = os.environ["GPUBOX_LOAD_KEY"]
CONTEXT = ssl.create_default_context(cafile="/etc/nginx/gpubox-tls/selfsigned.crt")
BODY = json.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": "the quick brown fox"}], "max_tokens": 24, "stream": True}
).encode()

with open(OUT, "a", encoding="utf-8") as out:
    while not os.path.exists(STOP):
        started = time.time()
        record = {"started": started, "status": None, "done": False, "error": ""}
        request = urllib.request.Request(
            "https://127.0.0.1/v1/chat/completions",
            data=BODY,
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY},
        )
        try:
            with urllib.request.urlopen(request, timeout=120, context=CONTEXT) as response:
                record["status"] = response.status
                text = response.read().decode()
                record["done"] = text.rstrip().endswith("data: [DONE]")
        except urllib.error.HTTPError as error:
            record["status"] = error.code
            record["error"] = error.read().decode()[:300]
        except Exception as error:  # a cut stream, a refused connection: recorded, not raised
            record["error"] = f"{type(error).__name__}: {error}"[:300]
        record["seconds"] = round(time.time() - started, 3)
        out.write(json.dumps(record) + "\n")
        out.flush()
        time.sleep(1)
with open(OUT + ".done", "w", encoding="utf-8") as done:
    done.write("stopped\n")
