"""The Python side of tests/export_test.sh.

  export_check.py llama EXPORT_DIR OURS      LlamaForCausalLM.from_pretrained(EXPORT_DIR) (transformers),
                                             every weight loaded, its fp32 logits on OURS's tokens against
                                             OURS's logits (tests/export_logits.cc): max |diff| / max |ref|
                                             must be at most 1e-4
  export_check.py gpt EXPORT_DIR OURS PEER   the same with tools/peer/gpt_peer.py's load_export (PEER)
  export_check.py same DIR_A DIR_B           both exports hold the same tensors, bit for bit
  export_check.py drop DIR NAME              rewrites the export without tensor NAME (file and index)
  export_check.py reshape DIR NAME           rewrites it with NAME's first dimension one shorter
  export_check.py extra DIR NAME             adds a tensor NAME.extra beside NAME (file and index)
Exits 1 with one line on a mismatch.
"""
import importlib.util
import json
import os
import sys

import torch

DTYPES = {"F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16, "F16": torch.float16}
NAMES = {v: k for k, v in DTYPES.items()}


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + b:8 + n + end]), dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
    return out, header.get("__metadata__", {})


def write(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def export_tensors(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read(os.path.join(directory, f))[0])
    return out


def compare(what, ref, ours):
    if ref.shape != ours.shape:
        sys.exit(f"export_check: {what}: logits of shape {tuple(ref.shape)} but ours are {tuple(ours.shape)}")
    rel = float((ref - ours).abs().max() / ref.abs().max())
    print(f"export_check: {what}: max |ref - ours| / max |ref| = {rel:.3e} over {ref.numel()} logits")
    if not rel <= 1e-4:
        sys.exit(f"export_check: {what}: the logits differ by {rel:.3e} relative (more than 1e-4)")


def main(argv):
    mode = argv[1]
    torch.manual_seed(0)
    if mode == "llama":
        from transformers import LlamaForCausalLM
        ours, _ = read(argv[3])
        model, info = LlamaForCausalLM.from_pretrained(argv[2], dtype=torch.float32, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if bad:
            sys.exit(f"export_check: transformers did not load every weight of {argv[2]}: {bad}")
        with torch.no_grad():
            ref = model.eval()(ours["tokens"]).logits.float()
        compare("transformers LlamaForCausalLM", ref, ours["logits"])
    elif mode == "gpt":
        ours, _ = read(argv[3])
        spec = importlib.util.spec_from_file_location("gpt_peer", argv[4])
        peer = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peer)
        model, _ = peer.load_export(argv[2])
        with torch.no_grad():
            ref = model(ours["tokens"]).float()
        compare("gpt_peer.py GPTStage", ref, ours["logits"])
    elif mode == "same":
        a, b = export_tensors(argv[2]), export_tensors(argv[3])
        if sorted(a) != sorted(b):
            sys.exit(f"export_check: {argv[2]} and {argv[3]} hold other tensor names")
        for k in a:
            if not torch.equal(a[k], b[k]):
                sys.exit(f"export_check: {k} differs between {argv[2]} and {argv[3]}")
        print(f"export_check: {len(a)} tensors equal")
    elif mode in ("drop", "reshape", "extra"):
        directory, name = argv[2], argv[3]
        index = os.path.join(directory, "model.safetensors.index.json")
        weight_map = json.load(open(index))["weight_map"] if os.path.exists(index) else None
        path = os.path.join(directory, weight_map[name] if weight_map else "model.safetensors")
        tensors, metadata = read(path)
        t = tensors.pop(name)
        if mode == "reshape":
            tensors[name] = t[:-1].clone()
        elif mode == "extra":
            tensors[name], tensors[name + ".extra"] = t, t
        write(path, tensors, metadata)
        if weight_map is not None:
            if mode == "drop":
                del weight_map[name]
            elif mode == "extra":
                weight_map[name + ".extra"] = weight_map[name]
            json.dump({"metadata": {}, "weight_map": weight_map}, open(index, "w"))
    else:
        sys.exit(f"export_check: unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv)
