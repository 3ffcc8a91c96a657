"""The shape of a decoder-only LM from its ``config.json``, without building it (no torch).

``ModelShape`` reads the keys Hugging Face writes for the Llama family (``model_type`` "llama",
"mistral", "qwen2" -- Qwen2 and Qwen2.5 --, "qwen3") and counts the parameters exactly:

* per block: attention q/k/v/o projections ``h*(H*d) + 2*h*(K*d) + (H*d)*h`` (H heads, K kv
  heads, head_dim d = ``head_dim`` or h/H), plus biases (qwen2: q, k and v always;
  llama/qwen3: ``attention_bias`` on q, k, v and o), plus qwen3's q_norm/k_norm (d each); the
  SwiGLU MLP ``3*h*I`` (plus ``mlp_bias``); two RMSNorms ``2*h``;
* the root: embeddings ``V*h``, the final norm ``h``, and the output head ``V*h`` unless
  ``tie_word_embeddings``.

``bundled_model_config(name)`` returns one of the config.json copies shipped in
``rllib_spear/assets/model_configs`` (the models of the papers' recipes), so that a recipe whose
``model_path`` is a placeholder (``/models/Qwen2.5-7B-Instruct``) or a hub id
(``meta-llama/Llama-3.1-8B-Instruct``) can be planned on a machine without the weights.
``model_config_for(model_path)`` resolves a recipe's ``model_path`` (see its docstring).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["ModelShape", "MODEL_CONFIGS_DIR", "bundled_model_names", "bundled_model_config",
           "model_config_for", "LINEAR_MODULES"]

#: Folder of the bundled config.json copies (one ``<model name>.json`` each).
MODEL_CONFIGS_DIR = Path(__file__).resolve().parent.parent / "assets" / "model_configs"

#: The linear layers of a block, by their HF module names (what LoRA ``target_modules`` name).
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelShape:
    """Dimensions of a Llama-family decoder (the fields of its config.json that size memory)."""

    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    dtype: str = "bfloat16"  # the checkpoint's torch_dtype (what the engines load by default)
    max_position_embeddings: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None) -> "ModelShape":
        """From a config.json mapping, a config.json file or a folder holding one."""
        if not isinstance(config, Mapping):
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            name = name or path.parent.name
            config = json.loads(path.read_text())
        mt = str(config.get("model_type", "")).lower()
        if mt not in _SUPPORTED:
            raise ValueError(f"model_type {mt!r} is not one the memory planner knows ({', '.join(_SUPPORTED)})")
        h = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        attention_bias = bool(config.get("attention_bias", False))
        return cls(
            name=name or str(config.get("_name_or_path") or mt),
            model_type=mt,
            hidden=h,
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or h // heads),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),  # False: these config classes' default
            # Qwen2Attention hard-codes bias=True on q/k/v (and none on o); the others follow
            # `attention_bias` on all four.
            qkv_bias=True if mt == "qwen2" else attention_bias,
            o_bias=False if mt == "qwen2" else attention_bias,
            mlp_bias=bool(config.get("mlp_bias", False)),
            qk_norm=mt == "qwen3",
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
            max_position_embeddings=int(config.get("max_position_embeddings") or 0),
        )

    # ------------------------------------------------------------------ widths
    @property
    def q_width(self) -> int:
        """H*d: width of the query (and attention output) per token."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """K*d: width of the keys (and of the values) per token."""
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """{module name: (in_features, out_features)} of one block's linear layers."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    # ------------------------------------------------------------------ parameter counts
    @property
    def block_linear_weights(self) -> int:
        """Weights (no biases) of one block's linear layers: what autocast casts to bf16."""
        return sum(a * b for a, b in self.linear_shapes().values())

    @property
    def block_params(self) -> int:
        """Parameters of one transformer block (one FSDP group)."""
        q, kv, i, h = self.q_width, self.kv_width, self.intermediate, self.hidden
        n = self.block_linear_weights + 2 * h  # + input / post-attention RMSNorm
        if self.qkv_bias:
            n += q + 2 * kv
        if self.o_bias:
            n += h
        if self.mlp_bias:
            n += 2 * i + h
        if self.qk_norm:
            n += 2 * self.head_dim
        return n

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """The output head's own weights (0 when tied to the embeddings)."""
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """Embeddings + final norm + head: FSDP's root group."""
        return self.embed_params + self.hidden + self.head_params

    @property
    def num_params(self) -> int:
        """Exact parameter count: L x block + root."""
        return self.layers * self.block_params + self.root_params

    @property
    def linear_weights(self) -> int:
        """All matmul weights autocast casts in one forward: the blocks' and the head's (the
        embeddings when tied: the head reuses them)."""
        return self.layers * self.block_linear_weights + self.vocab * self.hidden

    def lora_targets(self, target_modules: Any) -> list[str]:
        """Block module names a peft ``target_modules`` value selects: a list of names (a module
        matches when its name ends with one), "all-linear", or a regex on the full module name
        (``model.layers.0.self_attn.q_proj``)."""
        if target_modules is None:
            # peft's default for the Llama family
            return ["q_proj", "v_proj"]
        if isinstance(target_modules, str):
            if target_modules == "all-linear":
                return list(LINEAR_MODULES)
            parent = {m: "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
                      for m in LINEAR_MODULES}
            return [m for m in LINEAR_MODULES
                    if re.fullmatch(target_modules, f"model.layers.0.{parent[m]}.{m}")]
        names = [str(t) for t in target_modules]
        return [m for m in LINEAR_MODULES if any(t == m or t.endswith("." + m) for t in names)]

    def lora_params(self, lora: Mapping[str, Any]) -> int:
        """Adapter parameters: r x (in + out) per targeted linear layer, in every block."""
        r = int(lora.get("r", 8))
        shapes = self.linear_shapes()
        return self.layers * sum(r * (shapes[m][0] + shapes[m][1]) for m in self.lora_targets(lora.get("target_modules")))

    def kv_bytes_per_token(self, dtype_bytes: int, tensor_parallel: int = 1) -> int:
        """KV-cache bytes of one token on one engine GPU: 2 (K and V) x layers x kv heads per GPU
        x head_dim x dtype bytes. Tensor parallelism splits the kv heads (a head is replicated
        when there are fewer kv heads than GPUs)."""
        kv_per_gpu = max(1, -(-self.kv_heads // max(1, tensor_parallel)))
        return 2 * self.layers * kv_per_gpu * self.head_dim * dtype_bytes

    def summary(self) -> str:
        n = self.num_params
        size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
        return (f"{self.name}: {size} parameters ({n:,}), "
                f"{self.layers} layers, hidden {self.hidden}, intermediate {self.intermediate}, "
                f"{self.heads} heads / {self.kv_heads} kv heads x {self.head_dim}, vocab {self.vocab}, "
                f"{'tied' if self.tied else 'untied'} embeddings")


# ---------------------------------------------------------------------- bundled configs and resolution
def bundled_model_names() -> list[str]:
    """Names of the bundled config.json copies (e.g. "Qwen2.5-7B-Instruct")."""
    return sorted(p.stem for p in MODEL_CONFIGS_DIR.glob("*.json"))


def bundled_model_config(name: str) -> dict[str, Any]:
    """The bundled config.json of ``name`` (case-insensitive); KeyError naming the choices."""
    for n in bundled_model_names():
        if n.lower() == name.lower():
            return json.loads((MODEL_CONFIGS_DIR / f"{n}.json").read_text())
    raise KeyError(f"no bundled config.json for {name!r}; bundled: {', '.join(bundled_model_names())}")


def _family(name: str) -> str:
    """"Qwen2.5-7B-Instruct" -> "qwen2.5-7b": the part a fine-tune's folder name keeps."""
    return re.sub(r"-(instruct|chat|base)$", "", name.lower())


def _match_bundled(basename: str) -> tuple[str, str] | None:
    """(bundled name, how it matched) for a folder or hub-id basename: the exact name first, then
    the longest bundled family name the basename starts with (a fine-tune such as
    "qwen2.5-32b-retool-sft" keeps its base model's shape)."""
    low = basename.lower()
    names = bundled_model_names()
    for n in names:
        if n.lower() == low:
            return n, "by name"
    best = None
    for n in names:
        fam = _family(n)
        for prefix in (fam, "meta-" + fam):
            if low.startswith(prefix) and (len(low) == len(prefix) or not low[len(prefix)].isalnum()):
                if best is None or len(fam) > len(_family(best)):
                    best = n
    return (best, f"by the name prefix {_family(best)!r}") if best else None


def model_config_for(model_path: str, resolve: Callable[[str], str] | None = None
                     ) -> tuple[dict[str, Any], str, str]:
    """(config.json mapping, model name, where it came from) of a recipe's ``model_path``:

    1. a folder holding ``config.json`` (or the path of a config.json file): that file;
    2. "embedded" / "embedded:<task>": the project's cold start, in the folder ``resolve`` maps
       the name to (the memory planner passes ``rllib_spear.coldstart.resolve_model_path``: a
       file copy of the shipped build; this layer does not know the cold starts);
    3. otherwise the path's or hub id's last component matched to a bundled config
       (``/models/Qwen2.5-7B-Instruct``, ``meta-llama/Llama-3.1-8B-Instruct``, or a fine-tune
       folder named after its base model, e.g. ``qwen2.5-32b-retool-sft``).

    ValueError naming the fix when none applies.
    """
    path = str(model_path)
    if path == "embedded" or path.startswith("embedded:"):
        if resolve is None:
            raise ValueError(f"cannot size model_path {path!r}: a cold-start name; pass "
                             "resolve=rllib_spear.coldstart.resolve_model_path")
        folder = Path(resolve(path))
        return json.loads((folder / "config.json").read_text()), path, f"{folder}/config.json"
    p = Path(path).expanduser()
    if p.is_file() and p.name.endswith(".json"):
        return json.loads(p.read_text()), p.parent.name, str(p)
    if (p / "config.json").is_file():
        return json.loads((p / "config.json").read_text()), p.name, str(p / "config.json")
    base = path.rstrip("/").rsplit("/", 1)[-1]
    found = _match_bundled(base)
    if found is None:
        raise ValueError(
            f"cannot size model_path {path!r}: it is not a folder with a config.json here and its name "
            f"matches no bundled config ({', '.join(bundled_model_names())}). Put the model's config.json "
            f"in that folder (a save_pretrained folder has one), or copy it into {MODEL_CONFIGS_DIR}")
    name, how = found
    return bundled_model_config(name), name, f"bundled config.json of {name} (matched {how})"
