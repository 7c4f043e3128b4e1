"""Models for the examples, defined in code with seeded random weights (no downloads).

Two families for training and inference, each in a full size (the shape people benchmark) and
a small size (for tests):

- ``resnet50_like``: a ResNet-50-shaped CNN. Stem conv 7x7/2 + BatchNorm + ReLU + max-pool,
  then bottleneck blocks ``[3, 4, 6, 3]`` (1x1 -> 3x3 -> 1x1 convs, each followed by
  BatchNorm, expansion 4), global average pool, one Linear. Input ``(N, 3, 224, 224)``
  float32, output ``(N, num_classes)`` logits. ``resnet_small`` is the same code with
  one block per stage, base width 16 and 64x64 images.
- ``bert_like``: a BERT-base-shaped encoder written out (so every matmul, softmax and
  LayerNorm is visible to graph compilers): word + position + token-type embeddings and
  LayerNorm, 12 layers of multi-head self-attention (hidden 768, 12 heads) and a GELU
  feed-forward (intermediate 3072), post-LayerNorm, then BERT's pooler (first token,
  Linear + tanh) and a classifier. Inputs ``input_ids`` ``(N, seq_len)`` int64 and
  ``attention_mask`` ``(N, seq_len)`` int64 (1 = attend, 0 = padding); output
  ``(N, num_labels)`` logits. Default ``seq_len`` is 128. ``bert_small`` is 2 layers,
  hidden 64, 4 heads, sequence 32.

For inference only (``INFER_MODEL_NAMES``, examples/infer.py and scripts/bench_inference.py):

- ``mlp``: three Linear layers with GELU between them, 1024 -> 4096 -> 4096 -> 1000
  (about 25 M parameters), input ``(N, 1024)`` float32; small: 64 -> 128 -> 128 -> 10.
- ``block``: one BERT-base encoder layer (the ``bert`` family's own layer: attention with
  hidden 768 and 12 heads, GELU feed-forward 3072, post-LayerNorm) on ``(N, 128, 768)``
  float32 activations, no padding; small: hidden 64, 4 heads, sequence 32.
- ``timm-vit``: timm's ``vit_small_patch16_224`` built from its configuration
  (``pretrained=False``: nothing downloaded), input ``(N, 3, 224, 224)``; needs ``pip
  install timm``. Small: ``vit_tiny_patch16_224`` at the same input.
- ``hf-bert``: Hugging Face transformers' ``BertForSequenceClassification`` built from
  ``BertConfig()`` (BERT-base; no hub access), inputs ``input_ids`` and
  ``attention_mask`` ``(N, 128)``; needs ``pip install transformers``. Small: 2 layers,
  hidden 64, sequence 32.

The weights are random but reproducible: each builder seeds its own generator (the caller's
global RNG state is left untouched). CNN BatchNorm statistics are calibrated on one seeded
random batch, so activations keep a sane scale through the depth in eval mode (with the
default running statistics, mean 0 and variance 1, a random ResNet's activations grow
layer after layer) and Conv+BatchNorm folding has real numbers to fold.

Use::

    from models import make_model          # examples/ on sys.path
    model, make_inputs = make_model("cnn", size="small")
    inputs = make_inputs(8)                # tuple of tensors for batch 8
    logits = model(*inputs)
"""

from __future__ import annotations

import math
from typing import Callable, Sequence, Tuple

import torch
from torch import nn

#: Model names of the training example (examples/train_ddp.py).
MODEL_NAMES = ("cnn", "bert")
#: Every model name :func:`make_model` accepts (the inference examples take them all; the
#: last two need timm and transformers installed).
INFER_MODEL_NAMES = MODEL_NAMES + ("mlp", "block", "timm-vit", "hf-bert")
#: Sizes accepted by :func:`make_model`.
SIZES = ("full", "small")


# --------------------------------------------------------------------------- CNN


class Bottleneck(nn.Module):
    """ResNet bottleneck: 1x1 (width) -> 3x3 (width, stride) -> 1x1 (width * 4), each
    conv followed by BatchNorm, ReLU after the first two and after the residual add."""

    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int = 1):
        super().__init__()
        out_channels = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNetLike(nn.Module):
    """ResNet with bottleneck blocks.

    Args:
        layers: blocks per stage; ResNet-50 is ``(3, 4, 6, 3)``.
        width: channels of the stem and of the first stage's bottleneck (64 in ResNet-50);
            stage ``i`` uses ``width * 2**i``, its output has 4x that.
        num_classes: size of the output logits.

    Input ``(N, 3, H, W)`` float32 (H = W = 224 for the full model); output
    ``(N, num_classes)``.
    """

    def __init__(self, layers: Sequence[int] = (3, 4, 6, 3), width: int = 64,
                 num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        in_channels = width
        for i, blocks in enumerate(layers):
            stage_width = width * 2 ** i
            stride = 1 if i == 0 else 2
            stage = []
            for j in range(blocks):
                stage.append(Bottleneck(in_channels, stage_width, stride if j == 0 else 1))
                in_channels = stage_width * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = (
            stages + [nn.Identity()] * (4 - len(stages)))[:4]
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def _init_cnn(model: nn.Module, image_size: int, seed: int) -> None:
    """Kaiming init (as torchvision does), then calibrate BatchNorm running statistics on one
    seeded random batch (training-mode forward with cumulative averaging, no gradients)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.1, 0.1)
            m.momentum = None  # cumulative moving average over the calibration batch
    gen = torch.Generator().manual_seed(seed + 1)
    calib = torch.randn(4, 3, image_size, image_size, generator=gen)
    model.train()
    with torch.no_grad():
        model(calib)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    model.eval()


def resnet50_like(num_classes: int = 1000, *, width: int = 64,
                  layers: Sequence[int] = (3, 4, 6, 3), image_size: int = 224,
                  seed: int = 0) -> ResNetLike:
    """A ResNet-50-shaped CNN with seeded random weights, in eval mode.

    Args:
        num_classes: logits per sample.
        width: base channel width (64 = ResNet-50; smaller is faster).
        layers: bottleneck blocks per stage (``(3, 4, 6, 3)`` = ResNet-50).
        image_size: side of the square images used to calibrate BatchNorm (pixels).
        seed: weights are a function of this seed only.

    Input ``(N, 3, 224, 224)`` float32; output ``(N, num_classes)``. About 25.6 M parameters
    and 4.1 GFLOPs per 224x224 image at the defaults.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ResNetLike(layers, width, num_classes)
        _init_cnn(model, image_size, seed)
    return model


def resnet_small(num_classes: int = 10, *, seed: int = 0) -> ResNetLike:
    """Small, fast variant for tests: one bottleneck per stage, base width 16, for 64x64
    images. Input ``(N, 3, 64, 64)``; output ``(N, num_classes)``."""
    return resnet50_like(num_classes, width=16, layers=(1, 1, 1, 1), image_size=64, seed=seed)


# --------------------------------------------------------------------------- BERT


class SelfAttention(nn.Module):
    """Multi-head self-attention written out (q/k/v Linear, scaled dot product with an
    additive mask, softmax, context, output Linear)."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of heads {heads}")
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        return x.view(n, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        q = self._split(self.query(x))
        k = self._split(self.key(x))
        v = self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores + additive_mask, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return self.out(ctx.view(x.shape[0], x.shape[1], -1))


class EncoderLayer(nn.Module):
    """BERT layer (post-LayerNorm): x = LN(x + Attn(x)); x = LN(x + W2 GELU(W1 x))."""

    def __init__(self, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x, additive_mask))
        return self.norm2(x + self.output(nn.functional.gelu(self.intermediate(x))))


class BertLike(nn.Module):
    """BERT-shaped encoder classifier.

    forward(input_ids (N, S) int64, attention_mask (N, S) int64 of 1/0) -> (N, num_labels).
    S must not exceed ``max_positions``.
    """

    def __init__(self, vocab_size: int = 30522, hidden: int = 768, layers: int = 12,
                 heads: int = 12, intermediate: int = 3072, max_positions: int = 512,
                 type_vocab_size: int = 2, num_labels: int = 2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(
            EncoderLayer(hidden, heads, intermediate) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        positions = torch.arange(seq_len, device=input_ids.device).unsqueeze(0)
        x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
             + self.token_type_embeddings(torch.zeros_like(input_ids)))
        x = self.embed_norm(x)
        # (N, 1, 1, S): 0 where attended, a large negative number at padding.
        additive_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, additive_mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(pooled)


def _init_bert(model: nn.Module) -> None:
    """BERT's initialisation: normal(0, 0.02) weights, zero biases, LayerNorm (1, 0)."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def bert_like(*, vocab_size: int = 30522, hidden: int = 768, layers: int = 12,
              heads: int = 12, intermediate: int = 3072, max_positions: int = 512,
              num_labels: int = 2, seed: int = 0) -> BertLike:
    """A BERT-base-shaped encoder classifier with seeded random weights, in eval mode.

    Defaults are BERT-base: vocabulary 30522, hidden 768, 12 layers, 12 heads, feed-forward
    3072, 512 positions (about 110 M parameters). Inputs ``input_ids`` and
    ``attention_mask``, both ``(N, seq_len)`` int64; output ``(N, num_labels)``.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertLike(vocab_size, hidden, layers, heads, intermediate, max_positions,
                         num_labels=num_labels)
        _init_bert(model)
    return model.eval()


def bert_small(*, seed: int = 0) -> BertLike:
    """Small, fast variant for tests: vocabulary 1000, hidden 64, 2 layers, 4 heads,
    feed-forward 256, 64 positions. Use sequence length 32."""
    return bert_like(vocab_size=1000, hidden=64, layers=2, heads=4, intermediate=256,
                     max_positions=64, seed=seed)


# --------------------------------------------------------------------------- inference-only models


class MLP(nn.Module):
    """Linear -> GELU -> Linear -> GELU -> Linear."""

    def __init__(self, sizes: Sequence[int]):
        super().__init__()
        layers: list = []
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.GELU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Block(nn.Module):
    """One BERT encoder layer on activations, without padding (a zero additive mask)."""

    def __init__(self, hidden: int, heads: int, intermediate: int):
        super().__init__()
        self.layer = EncoderLayer(hidden, heads, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[0], 1, 1, x.shape[1], dtype=x.dtype, device=x.device)
        return self.layer(x, mask)


def _seeded(build: Callable[[], nn.Module], seed: int, init: Callable[[nn.Module], None] = _init_bert) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build()
        init(model)
    return model.eval()


def _timm_vit(small: bool, seed: int) -> nn.Module:
    import timm  # pip install timm; built from its config, no download

    name = "vit_tiny_patch16_224" if small else "vit_small_patch16_224"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return timm.create_model(name, pretrained=False).eval()


class _HfLogits(nn.Module):
    """transformers' model returning its logits tensor (not a ModelOutput), so every path
    takes it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def _hf_bert(small: bool, seed: int) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification  # pip install transformers

    cfg = (BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=256, max_position_embeddings=64) if small else BertConfig())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _HfLogits(BertForSequenceClassification(cfg)).eval()


# --------------------------------------------------------------------------- registry

InputsFn = Callable[[int], Tuple[torch.Tensor, ...]]


def make_model(name: str, size: str = "full", *, seed: int = 0) -> Tuple[nn.Module, InputsFn]:
    """Build a model and a function that makes example inputs for it.

    Args:
        name: "cnn" (ResNet-50-like; small: :func:`resnet_small`), "bert" (BERT-base-like;
            small: :func:`bert_small`), or an inference-only model: "mlp", "block",
            "timm-vit", "hf-bert" (module doc).
        size: "full" or "small".
        seed: seeds the weights; the inputs function uses its own fixed seed.

    Returns:
        ``(model, example_inputs)``: the model in eval mode, and ``example_inputs(batch_size)``
        returning a tuple of tensors to call it with: cnn ``((N, 3, 224, 224) float32,)``
        (64x64 for small); bert and hf-bert ``((N, 128) int64 ids, (N, 128) int64 mask of
        ones)`` (sequence 32 for small); mlp ``((N, 1024),)`` (64 small); block ``((N, 128,
        768),)`` ((N, 32, 64) small); timm-vit ``((N, 3, 224, 224),)``.

    Raises:
        ValueError: unknown name or size.
    """
    if name not in INFER_MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(INFER_MODEL_NAMES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {', '.join(SIZES)}")
    small = size == "small"
    if name in ("mlp", "block", "timm-vit"):
        return _inference_model(name, small, seed)
    if name == "cnn":
        model = resnet_small(seed=seed) if small else resnet50_like(seed=seed)
        image = 64 if small else 224

        def cnn_inputs(batch_size: int) -> Tuple[torch.Tensor, ...]:
            gen = torch.Generator().manual_seed(1234)
            return (torch.randn(batch_size, 3, image, image, generator=gen),)

        return model, cnn_inputs

    if name == "hf-bert":
        model = _hf_bert(small, seed)
        vocab = model.model.config.vocab_size
    else:
        model = bert_small(seed=seed) if small else bert_like(seed=seed)
        vocab = model.word_embeddings.num_embeddings
    seq_len = 32 if small else 128

    def bert_inputs(batch_size: int) -> Tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
        return ids, torch.ones(batch_size, seq_len, dtype=torch.int64)

    return model, bert_inputs


def _inference_model(name: str, small: bool, seed: int) -> Tuple[nn.Module, InputsFn]:
    """mlp, block and timm-vit with their inputs function (see :func:`make_model`)."""
    if name == "mlp":
        sizes = (64, 128, 128, 10) if small else (1024, 4096, 4096, 1000)
        model = _seeded(lambda: MLP(sizes), seed)
        shape: Tuple[int, ...] = (sizes[0],)
    elif name == "block":
        hidden, heads, inter, seq = (64, 4, 256, 32) if small else (768, 12, 3072, 128)
        model = _seeded(lambda: Block(hidden, heads, inter), seed)
        shape = (seq, hidden)
    else:
        model = _timm_vit(small, seed)
        shape = (3, 224, 224)

    def inputs(batch_size: int) -> Tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(1234)
        return (torch.randn(batch_size, *shape, generator=gen),)

    return model, inputs
