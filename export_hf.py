"""
Export a finished run as a Hugging Face model folder that transformers and lm-evaluation-harness read.

    python export_hf.py runs/quickstart out/quickstart-hf
    lm_eval --model hf --tasks TASK --include_path TASKS_DIR --log_samples --output_path out/lm-eval \\
        --model_args pretrained=out/quickstart-hf,trust_remote_code=True,add_bos_token=True,dtype=float32

    model = AutoModelForCausalLM.from_pretrained("out/quickstart-hf", trust_remote_code=True)  # num_loops=8: 8 loops
    tokenizer = AutoTokenizer.from_pretrained("out/quickstart-hf", trust_remote_code=True)    # puts BOS first
    new = model.generate(**tokenizer(["The history of"], return_tensors="pt"), max_new_tokens=32, do_sample=False)

DIR gets config.json (the run's flops.ModelConfig fields, and num_loops: the loop count of forward() and
generate(), the trained r, or for a run trained at sampled loop counts the whole count nearest their mean, unless
from_pretrained(..., num_loops=k) says otherwise), model.safetensors (GPT's
own parameter names under "gpt."), the tokenizer (tokenizer.json: the run's BPE or SentencePiece model, the same
ids as dataloader.Tokenizer, BOS first as every training document starts) and the remote code: model.py and the
project modules it imports, found by following the imports and copied with those imports made package-relative,
beside modeling_nanoloop.py, a small wrapper that builds model.GPT from the config. So the exported model is
model.py itself, not a second copy of it: a change there reaches the next export, and the export's logits are
model.py's (tests/test_export.py).

Why lm_eval runs the exported folder (its own hf model) and not a model class of ours registered with lm_eval:
its hf model already tokenises, batches, crops and sums the per-item log-likelihoods, and an exported folder is
what other tools and the Hub take too, so one artefact serves both. A registered class would be a third path
into model.py, live here, import lm_eval, and work only from this repository. With add_bos_token=True the
harness scores a language-modelling item's continuation after BOS and the context, as evaluate.py's --scoring
core does (equal to 1e-5, tests/test_export.py); max_length=SEQ_LEN-1 also crops an over-long item to
evaluate.py's window. In a task YAML of output_type loglikelihood, put the delimiter into the target
(doc_to_target: " {{continuation}}"): lm_eval adds target_delimiter only to multiple-choice targets.

Needs transformers and safetensors (pip install -r requirements-dev.txt); no other file of the project imports them.
"""
import argparse
import ast
import dataclasses
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from nanoloop import common
from nanoloop.common import DataError
from nanoloop.dataloader import BOS_TOKEN, EXTRA_TOKEN, SPLIT_PATTERN, read_meta
from nanoloop.loops import mean_loops
from nanoloop.runs import check_run, load_run_model

ROOT = Path(__file__).resolve().parent
WRAPPER = "modeling_nanoloop"  # the module config.json's auto_map names
# What the wrapper imports of the project (GPT and rope_tables, ModelConfig, cached_forward); everything these
# import comes along, found from their imports (library_modules).
WRAPPER_IMPORTS = ("model", "flops", "nanoloop.engine")
PACKAGE = "nanoloop"  # the library's package: its modules are copied beside model.py
NEEDED = ("transformers", "safetensors")  # their versions are pinned in requirements-dev.txt


def fail(message):
    """Bad input: one line on stderr, exit 2, before any expensive work (common.fail)."""
    common.fail("export_hf.py", message)


# ----------------------------------------------------------------------------------------------
# The remote code: the project's own files, their imports made package-relative

def module_file(name):
    """The file of project module `name` ("model" at the root, "nanoloop.engine" in the package), else None."""
    path = ROOT.joinpath(*name.split(".")).with_suffix(".py")
    if path.is_file():
        return path
    return None


def export_name(name):
    """A module's name in the export, whose folder is flat (transformers loads remote code from one folder):
    nanoloop.engine becomes engine."""
    return name.split(".")[-1]


def imported_modules(node):
    """The project modules (dotted names) one import statement names: `import flops`, `from flops import X`,
    `from nanoloop.common import X`, `from nanoloop import cpu_attention`."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == PACKAGE:
        names = [f"{PACKAGE}.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [node.module]
    else:
        names = []
    return [name for name in names if module_file(name)]


def project_imports(source):
    """The import statements (ast nodes, at any depth) of `source` that name a project module."""
    return [node for node in ast.walk(ast.parse(source)) if imported_modules(node)]


def library_modules(roots=WRAPPER_IMPORTS):
    """The project modules `roots` need, the roots included: their imports, followed until nothing new appears
    (computed, so a new import in model.py travels with the next export)."""
    todo, found = list(roots), set()
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for node in project_imports(module_file(name).read_text()):
            todo += imported_modules(node)
    return sorted(found)


def relative_statements(node):
    """The package-relative form of an import of project modules, as statements: `from flops import X` becomes
    `from .flops import X`, `from nanoloop.common import X` becomes `from .common import X`, and `import flops`
    or `from nanoloop import cpu_attention` becomes `from . import flops` or `from . import cpu_attention`; other
    modules of the same `import` statement keep an `import` of their own."""
    if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
        return [ast.unparse(ast.ImportFrom(module=None, names=node.names, level=1))]
    if isinstance(node, ast.ImportFrom):
        return [ast.unparse(ast.ImportFrom(module=export_name(node.module), names=node.names, level=1))]
    ours = [alias for alias in node.names if module_file(alias.name)]
    others = [alias for alias in node.names if not module_file(alias.name)]
    statements = [ast.unparse(ast.ImportFrom(module=None, names=ours, level=1))]
    if others:
        statements.insert(0, ast.unparse(ast.Import(names=others)))
    return statements


def replace_spans(source, edits):
    """`source` with the text of each (ast node, new text) edit replaced; ast counts columns in UTF-8 bytes."""
    lines = source.encode().splitlines(keepends=True)
    for node, text in sorted(edits, key=lambda edit: (edit[0].lineno, edit[0].col_offset), reverse=True):
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        lines[node.lineno - 1:node.end_lineno] = [first[:node.col_offset] + text.encode() + last[node.end_col_offset:]]
    return b"".join(lines).decode()


def relative_source(name):
    """Project module `name`'s text as the export holds it, changed in one way only: its imports of project modules
    become package-relative. (cpu_attention.py names its torch ops after its own module, so a copy registers ops
    of its own beside the repository's.)"""
    source = module_file(name).read_text()
    edits = []
    for node in project_imports(source):
        indent = " " * node.col_offset
        edits.append((node, ("\n" + indent).join(relative_statements(node))))
    return replace_spans(source, edits)


# ----------------------------------------------------------------------------------------------
# The wrapper: a transformers config and causal-LM class around model.GPT

WRAPPER_SOURCE = '''"""
A nanoloop run as a transformers model (written by nanoloop's export_hf.py). NanoloopConfig holds the run's
flops.ModelConfig fields and num_loops; NanoloopForCausalLM builds model.GPT from them. The other .py files of
this folder are nanoloop's own, copied with their imports made package-relative.

Without a cache or padding, forward() is model.py's own GPT.forward at num_loops loops. generate() (or a forward
given a cache, use_cache=True or a padded attention_mask) runs engine.cached_forward through a LoopCache: one
cache layer per executed layer, prelude + r * recur + coda (the looped model's exact KV cache).
"""
import torch
import torch.nn.functional as F
from transformers import DynamicCache, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .engine import cached_forward
from .flops import ModelConfig
from .model import GPT, rope_tables

# transformers copies a file of this folder into its module cache only when a `from .NAME import` line names it
# (an `import NAME` of nanoloop became `from . import NAME`, which it does not see), so each is named here once.
@COPIED_MODULES@


class NanoloopConfig(PretrainedConfig):
    model_type = "nanoloop"

    def __init__(self, nanoloop=None, num_loops=None, **kwargs):
        self.nanoloop = nanoloop  # flops.ModelConfig's fields, as the run trained
        self.num_loops = num_loops  # the loop count of forward() and generate(); None: the trained r
        super().__init__(**kwargs)


class LoopCache(DynamicCache):
    """model.py's cache interface (begin, attend, r: engine.KVCache's) over transformers' DynamicCache, so that
    generate() keeps, reorders and grows it. The mask and positions follow engine.KVCache for left-padded rows:
    a row counts positions from its first real token, and a padding query sees only itself."""

    def __init__(self, r, head_dim):
        super().__init__()
        self.r, self.head_dim = r, head_dim
        self.real = None  # (B, columns so far) bool: which columns hold real tokens (the attention mask)

    def begin(self, T):
        """Open T new columns: the mask their layers share (B, 1, T, S) and RoPE's cos, sin at each position."""
        past = self.get_seq_length()
        device = self.real.device
        cols = torch.arange(past, past + T, device=device)[:, None]
        keys = torch.arange(past + T, device=device)[None, :]
        self.mask = ((keys <= cols) & (self.real[:, None, :] | (keys == cols)))[:, None]
        self.layer = 0
        positions = (self.real.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        cos, sin = rope_tables(int(positions.max()) + 1, self.head_dim, device)
        return cos[positions], sin[positions]

    def attend(self, q, k, v):
        """Append this layer's keys and values (q, k, v: (B, T, H, D)) and attend over all its columns."""
        keys, values = self.update(k.transpose(1, 2), v.transpose(1, 2), self.layer)
        self.layer += 1
        y = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=self.mask)
        return y.transpose(1, 2)


class NanoloopForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = NanoloopConfig
    base_model_prefix = "gpt"
    main_input_name = "input_ids"

    def __init__(self, config):
        super().__init__(config)
        self.gpt = GPT(ModelConfig(**config.nanoloop))
        self.backend_device = None  # the device model.attention_backend last chose a kernel for
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # generate() would size a DynamicCache by the config's layers; forward() makes a LoopCache

    def _init_weights(self, module):
        """Only RoPE's tables: every parameter comes from model.safetensors, and the tables are not saved."""
        if isinstance(module, GPT):
            cos, sin = rope_tables(module.cfg.seq_len, module.cfg.head_dim, module.rope_cos.device)
            module.rope_cos.copy_(cos)
            module.rope_sin.copy_(sin)

    def get_input_embeddings(self):
        return self.gpt.wte

    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None, labels=None, **kwargs):
        r = self.config.num_loops or self.gpt.cfg.r
        if self.backend_device != input_ids.device:
            self.gpt.set_device_backend(input_ids.device)
            self.backend_device = input_ids.device
        padded = attention_mask is not None and not bool(attention_mask.all())
        if cache is None and not use_cache and not padded:
            logits = self.gpt(input_ids, r=r)
        else:
            if cache is None:
                cache = LoopCache(r, self.gpt.cfg.head_dim)
            if not isinstance(cache, LoopCache) or cache.r != r:
                raise ValueError(f"a nanoloop model at {r} loops needs its own LoopCache (pass none: it makes one)")
            if attention_mask is None:
                attention_mask = torch.ones(input_ids.shape[0], cache.get_seq_length() + input_ids.shape[1],
                                            dtype=torch.bool, device=input_ids.device)
            cache.real = attention_mask.bool()
            logits = cached_forward(self.gpt, input_ids, cache)
        loss = None
        if labels is not None:  # transformers' convention: labels are the inputs, shifted here; -100 is ignored
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)
'''


def wrapper_source(modules):
    """modeling_nanoloop.py: WRAPPER_SOURCE with a `from .NAME import` line for each copied module."""
    names = [export_name(name) for name in modules]
    lines = [f"from .{name} import __name__ as {name}_module  # noqa: F401" for name in names]
    return WRAPPER_SOURCE.replace("@COPIED_MODULES@", "\n".join(lines))


# ----------------------------------------------------------------------------------------------
# config.json, model.safetensors, the tokenizer

def config_json(run, model, meta):
    """config.json: what transformers needs to find and build the wrapper, and the run it came from."""
    cfg = model.cfg
    bos = meta["bos_id"]
    return {"model_type": "nanoloop", "architectures": ["NanoloopForCausalLM"],
            "auto_map": {"AutoConfig": f"{WRAPPER}.NanoloopConfig",
                         "AutoModelForCausalLM": f"{WRAPPER}.NanoloopForCausalLM"},
            "nanoloop": dataclasses.asdict(cfg), "num_loops": mean_loops(run["loops"], cfg.r),  # sampled: E[T]
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "num_attention_heads": cfg.n_head,
            "max_position_embeddings": cfg.seq_len,  # GPT.forward refuses longer inputs; generate() goes past it
            "bos_token_id": bos, "eos_token_id": bos, "pad_token_id": bos,  # a document ends where the next BOS starts
            "tie_word_embeddings": False, "dtype": "float32", "use_cache": True,
            "nanoloop_run": {"run_id": run["run_id"], "name": run["name"], "steps": run["steps"]}}


def weights(model):
    """model.safetensors' tensors: GPT's state_dict under the wrapper's attribute, gpt."""
    return {f"gpt.{name}": tensor.detach().contiguous() for name, tensor in model.state_dict().items()}


def bpe_backend(path):
    """dataloader.Tokenizer's 'bpe' as a tokenizers.Tokenizer: tiktoken's ranks as byte-level BPE merges, split
    by SPLIT_PATTERN, then <|bos|> at the id after the last merge."""
    from transformers.convert_slow_tokenizer import TikTokenConverter
    return TikTokenConverter(vocab_file=str(path), pattern=SPLIT_PATTERN, extra_special_tokens=[BOS_TOKEN]).converted()


def sentencepiece_backend(path):
    """dataloader.Tokenizer's 'llama2' as a tokenizers.Tokenizer: transformers converts the SentencePiece model (a
    folder's tokenizer.model), then EXTRA_TOKEN takes the id after its pieces. SentencePiece puts its "▁" before
    every text, also one that starts with a space; transformers' converted pre-tokenizer skips it there, so the
    normaliser does it instead (as the first Llama fast tokenizers did)."""
    from tokenizers import AddedToken, normalizers
    from transformers import LlamaTokenizer
    with tempfile.TemporaryDirectory() as folder:
        shutil.copyfile(path, Path(folder) / "tokenizer.model")
        backend = LlamaTokenizer.from_pretrained(folder).backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    backend.add_special_tokens([AddedToken(EXTRA_TOKEN, special=True, normalized=False)])
    return backend


def hf_tokenizer(data_dir):
    """The run's tokenizer (the file dataloader.load_tokenizer reads) as transformers': the same ids for every
    text, BOS (meta.json's bos_id) put first as every training document starts, and a special token's text in
    the input kept as text, as dataloader.Tokenizer.encode keeps it."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    meta = read_meta(data_dir, verify=False)
    path = Path(data_dir) / meta["tokenizer_file"]
    if meta["tokenizer_kind"] == "bpe":
        backend = bpe_backend(path)
    else:
        backend = sentencepiece_backend(path)
    bos_id = meta["bos_id"]
    bos = backend.id_to_token(bos_id)
    if backend.get_vocab_size() != meta["vocab_size"]:
        raise DataError(f"{path}: transformers reads {backend.get_vocab_size()} ids, meta.json says "
                        f"{meta['vocab_size']}")
    backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                           special_tokens=[(bos, bos_id)])
    # A document ends where the next one's BOS starts: BOS is also EOS (generate() stops there) and padding.
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=bos, pad_token=bos,
                                   split_special_tokens=True)


# ----------------------------------------------------------------------------------------------
# The command line

def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a finished run folder (ckpt.pt, final.json), as evaluate.py takes")
    parser.add_argument("dir", help="the folder to write; it must not exist yet")
    parser.add_argument("--data", default="",
                        help="data folder with the run's tokenizer (default: the one it trained on)")
    return common.one_line_errors(parser, "export_hf.py").parse_args(argv)


def write_export(folder, run, model, tokenizer, meta):
    """Every file of the export into `folder` (an empty temporary folder)."""
    from safetensors.torch import save_file
    modules = library_modules()
    for name in modules:
        (folder / f"{export_name(name)}.py").write_text(relative_source(name))
    (folder / f"{WRAPPER}.py").write_text(wrapper_source(modules))
    (folder / "config.json").write_text(json.dumps(config_json(run, model, meta), indent=2) + "\n")
    save_file(weights(model), folder / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
    return modules


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.dir)
    if out.exists():
        fail(f"{out} already exists: an export writes a new folder (remove it or choose another)")
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"{' and '.join(missing)} not installed: pip install -r requirements-dev.txt (the tested versions)")
    try:
        run = check_run(args.run, args.data)
        model = load_run_model(run, "cpu")
        meta = read_meta(run["data_dir"], verify=False)
        tokenizer = hf_tokenizer(run["data_dir"])
    except DataError as e:
        fail(str(e))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # whole or absent: renamed at the end
    try:
        modules = write_export(staging, run, model, tokenizer, meta)
        os.rename(staging, out)
    except OSError as e:
        common.fail("export_hf.py", f"cannot write {out}: {e}", code=1)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"exported {run['name']} (r = {model.cfg.r}, {meta['tokenizer_kind']} tokenizer) to {out}: "
          f"{', '.join(f'{export_name(name)}.py' for name in modules)} and {WRAPPER}.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
