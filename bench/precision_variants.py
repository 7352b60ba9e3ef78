"""Which lower-precision variants of the exported MiniLM keep recall@10 >= 0.99 against float32 on hard data (make
bench's 10,000 documents) and on prose (Python's documentation paragraphs), and how fast each encodes 2,000 of the
documents (3 rounds interleaved in this one process, median, load average printed beside). The table in
docs/BENCHMARKS.md ("Fast precision for encoders") came from this script. Slow on a loaded 2-core machine (10+ min).

    .venv/bin/python bench/precision_variants.py [NAME-SUBSTRING ...]
"""
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent)); sys.path.insert(0, str(HERE))
import numpy as np, pyarrow.parquet as pq, openvino as ov
from batch_assets.resources.hf.embedder import SentenceTransformerEmbedder
from resources.hf.precision import per_row_recall, estimate
from resources.hf.onnx_encoder import ExportedEncoder, min_cosine
from fidelity import compare
from data import write_documents

from common import WORK as BENCH_WORK

WORK = BENCH_WORK / "precision-variants"
texts = [t for p in write_documents(WORK / "docs", 10_000) for t in pq.read_table(p).column("text").to_pylist()]
def pydoc():
    from pydoc_data.topics import topics
    seen=set(); out=[]
    for name in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[name]):
            t=" ".join(para.split())
            if not 60<=len(t)<=400 or t.startswith((">>>","...")) or sum(c.isalpha() for c in t)<0.7*len(t) or t in seen: continue
            seen.add(t); out.append(t)
    return out
prose = pydoc()
e = SentenceTransformerEmbedder(device="cpu").load_for_tests()
exported = e.loaded.exported
exact = ExportedEncoder(exported, "openvino")
prose_ex = exact.encode(prose, normalize_embeddings=True)
ex10k = exact.encode(texts, normalize_embeddings=True)

core = ov.Core()
def ov_variant(mark):
    """An ExportedEncoder whose compiled model is bf16 except the nodes `mark` keeps in f32."""
    enc = ExportedEncoder(exported, "openvino", precision="bf16")
    model = core.read_model(str(exported.graph))
    kept = 0
    for node in model.get_ops():
        if mark(node):
            node.get_rt_info()["disable_fp16_compression_0"] = ""
            kept += 1
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY",
                                                  "INFERENCE_NUM_THREADS": 2})
    req = compiled.create_infer_request()
    enc._run = lambda feeds: req.infer(feeds)[0].copy()
    return enc, kept

def is_weight_matmul(node):
    if node.get_type_name() != "MatMul": return False
    return any(i.get_source_output().get_node().get_type_name() in ("Constant", "Convert", "Multiply", "Subtract") and
               "Constant" in {i.get_source_output().get_node().get_type_name()} for i in node.inputs())
def weight_matmul(node):
    return node.get_type_name() == "MatMul" and any(
        i.get_source_output().get_node().get_type_name() == "Constant" for i in node.inputs())
layer_re = re.compile(r"layer\.(\d+)\.")
def in_layer(node, layers):
    m = layer_re.search(node.get_friendly_name()); return bool(m) and int(m.group(1)) in layers

def f16():
    enc = ExportedEncoder(exported, "openvino")
    c = core.compile_model(str(exported.graph), "CPU", {"INFERENCE_PRECISION_HINT": "f16", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2})
    print("f16 compiled, runtime precision:", c.get_property("INFERENCE_PRECISION_HINT"))
    r = c.create_infer_request(); enc._run = lambda feeds: r.infer(feeds)[0].copy(); return enc, 0
variants = {
    "f16 (OpenVINO INFERENCE_PRECISION_HINT f16)": f16,
    "bf16 (today's fast)": lambda: (ExportedEncoder(exported, "openvino", precision="bf16"), 0),
    "bf16, only weight MatMuls in bf16": lambda: ov_variant(lambda n: not weight_matmul(n)),
    "bf16, every MatMul bf16, the rest f32": lambda: ov_variant(lambda n: n.get_type_name() != "MatMul"),
    "bf16, last layer f32": lambda: ov_variant(lambda n: in_layer(n, {5})),
    "bf16, first+last layers f32": lambda: ov_variant(lambda n: in_layer(n, {0, 5})),
}
# onnxruntime int8 dynamic quantisation (weights int8 per channel, activations quantised at run time)
try:
    from onnxruntime.quantization import quantize_dynamic, QuantType
    q = WORK / "model.int8.onnx"
    if not q.exists():
        quantize_dynamic(str(exported.graph), str(q), weight_type=QuantType.QInt8, per_channel=True)
    import onnxruntime as ort
    def ort_int8():
        enc = ExportedEncoder(exported, "onnx")
        o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
        s = ort.InferenceSession(str(q), o, providers=["CPUExecutionProvider"])
        enc._run = lambda feeds: s.run(None, feeds)[0]
        return enc, 0
    variants["int8 dynamic (onnxruntime quantize_dynamic, per channel)"] = ort_int8
    def ov_int8():  # the same int8 graph run by OpenVINO (AMX/VNNI int8)
        enc = ExportedEncoder(exported, "openvino")
        c = core.compile_model(str(q), "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2})
        r = c.create_infer_request(); enc._run = lambda feeds: r.infer(feeds)[0].copy(); return enc, 0
    variants["int8 dynamic graph on OpenVINO"] = ov_int8
except Exception as exc:
    print("int8 skipped:", exc)
only = sys.argv[1:] 
ids = [str(i) for i in range(len(texts))]
rows = {}
speed_slice = texts[:2000]
for name, make in variants.items():
    if only and not any(o in name for o in only): continue
    enc, kept = make()
    enc.encode(speed_slice[:64])  # warm
    v = enc.encode(texts, normalize_embeddings=True)
    full = compare(ids, ex10k, ids, v)
    pv = enc.encode(prose, normalize_embeddings=True)
    rows[name] = {"kept_f32_nodes": kept, "bench_recall10_10k": full["recall_at_10"], "bench_min_cos": full["min_cosine"],
                  "prose_recall10": round(float(per_row_recall(prose_ex, pv).mean()), 4),
                  "prose_min_cos": round(min_cosine(prose_ex, pv), 6), "enc": enc}
    print(name, {k: v for k, v in rows[name].items() if k != "enc"}, flush=True)
# speed: interleaved, 3 rounds, each variant and exact encode the same 2,000 documents
times = {n: [] for n in ["exact f32", *rows]}
encs = {"exact f32": exact, **{n: r["enc"] for n, r in rows.items()}}
for rnd in range(3):
    for n, enc in encs.items():
        t = time.perf_counter(); enc.encode(speed_slice); times[n].append(time.perf_counter() - t)
    print("round", rnd, "load", os.getloadavg(), flush=True)
for n in times:
    med = sorted(times[n])[1]
    print(f"{n}: {med:.2f} s per 2,000 docs (median of 3), {sorted(times['exact f32'])[1] / med:.2f}x exact", [round(x, 2) for x in times[n]])
