"""Plain torch's answer for tests/scripts/decode_greedy.py, shared by the CPU e2e test (tests/e2e/test_e2e_batch.py)
and the GPU one (tests/gpu/test_cuda_batch.py)."""

# Each sequence's first divergent greedy token per probe of decode_greedy.py, computed with plain torch: the script's
# own decode of the whole batch, and at each step the same prefix evaluated at every probe size. Which sizes flip a
# token is the CPU's (its kernels' blocking, and how near a tie its logits come), so it is derived here.
PLAIN_TOKENS = """
import importlib.util, json, sys
import torch
from detaudit.recorder.batchprobe import default_sizes
spec = importlib.util.spec_from_file_location("decode_greedy", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
device, dtype = sys.argv[2:4] if len(sys.argv) > 2 else ("cpu", "float32")
model, ids = script.build(device, dtype), script.prompts(device)
first = {}
with torch.no_grad():
    for position in range(4):
        whole = model(ids)[:, -1].argmax(-1)
        n = ids.shape[0]
        probes = [("prefix", k, model(ids[:k])[:, -1].argmax(-1)) for k in default_sizes(n) if k < n]
        probes.append(("reversed", n, model(ids.flip(0))[:, -1].argmax(-1).flip(0)))
        for kind, k, got in probes:
            for row in range(len(got)):
                if int(got[row]) != int(whole[row]):
                    first.setdefault(f"{row} {kind} {k}", [row, position, kind, k, int(whole[row]), int(got[row])])
        ids = torch.cat([ids, whole[:, None]], dim=1)
print(json.dumps(sorted(first.values())))
"""

