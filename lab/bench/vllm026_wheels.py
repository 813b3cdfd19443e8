"""The wheels vLLM 0.26.0's offline LLM path needs on the GPU machine beyond its image, downloaded into DIR.

    python3 lab/bench/vllm026_wheels.py DIR

Seeds: the packages the offline path imports (resolved on CPU, ../shared/device/VLLM_0.26.md) and
vLLM's small direct requirements; each is downloaded --no-deps for CPython 3.12 manylinux, and its
requirements (markers evaluated for that platform) are followed, except packages the device's image
holds (KINDS.md's list, IMAGE below) and the GPU libraries a dense bf16 run with TRITON_ATTN leaves
unused (SKIP).
"""
import os
import subprocess
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SEEDS = """annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 cbor2==6.3.0 fastapi==0.136.3
googleapis-common-protos==1.76.0 httpx2==2.16.2 llguidance==1.7.6 msgspec==0.23.0 openai==3.57.0
openai-harmony==0.0.8 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2
opentelemetry-exporter-otlp==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-semantic-conventions==0.66b2 opentelemetry-semantic-conventions-ai==0.5.1
partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0
sniffio==1.3.1 starlette==1.10.0 typing-inspection==0.4.5 xgrammar==0.2.9 blake3 lm-format-enforcer==0.11.3
outlines_core==0.2.14 lark==1.2.2 compressed-tensors==0.17.0 depyf==0.20.0 python-json-logger ijson
setproctitle nvtx==0.2.15""".split()

IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet
filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore
httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())

SKIP = {"torchcodec", "pynvvideocodec", "flashinfer-python", "tilelang", "fastsafetensors", "quack-kernels",
        "tokenspeed-mla", "humming-kernels", "mcp", "model-hosting-container-standards", "ray"}

ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_system": "Linux",
       "platform_machine": "x86_64", "sys_platform": "linux", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
TAGS = "2_39 2_35 2_34 2_31 2_28 2_27 2_24 2_17 2014 2_5 1".split()


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    platforms = [a for t in TAGS for a in ("--platform", f"manylinux{'_' if '_' in t else ''}{t}_x86_64")]
    seen, queue = set(), [Requirement(s) for s in SEEDS]
    while queue:
        req = queue.pop()
        name = canonicalize_name(req.name)
        if name in seen or name in IMAGE or name in SKIP or name.startswith("nvidia-"):
            continue
        seen.add(name)
        before = set(os.listdir(out))
        subprocess.run(["pip", "download", "-q", "--no-deps", "-d", out, "--python-version", "3.12",
                        "--only-binary=:all:", *platforms, str(req)], check=True)
        new = sorted(set(os.listdir(out)) - before) or [
            f for f in os.listdir(out) if canonicalize_name(f.split("-")[0]) == name]
        with zipfile.ZipFile(os.path.join(out, new[0])) as wheel:
            meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
            for line in wheel.read(meta).decode().splitlines():
                if line.startswith("Requires-Dist:"):
                    dep = Requirement(line.split(":", 1)[1].strip())
                    if dep.marker is None or dep.marker.evaluate(ENV):
                        queue.append(dep)
        print(name, new[0])


if __name__ == "__main__":
    main(sys.argv[1])
