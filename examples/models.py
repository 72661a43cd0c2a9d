"""Example models of the demo, written as TorchScript by make_models()."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLPBlock(nn.Module):
    """A transformer MLP: matmul, bias, GELU, matmul, bias, residual."""

    def __init__(self, d=512, hidden=2048):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(d, hidden) / d**0.5)
        self.b1 = nn.Parameter(torch.randn(hidden) * 0.1)
        self.w2 = nn.Parameter(torch.randn(hidden, d) / hidden**0.5)
        self.b2 = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x):
        h = F.gelu(x @ self.w1 + self.b1)
        return h @ self.w2 + self.b2 + x


class ActivationBlock(nn.Module):
    """An elementwise-heavy block: gated activations, scaling, clamping and a residual."""

    def __init__(self, width=4096):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(width) + 0.5)
        self.shift = nn.Parameter(torch.randn(width) * 0.1)

    def forward(self, x, gate):
        y = x * self.scale + self.shift
        y = F.silu(y) * torch.sigmoid(gate)
        y = torch.clamp(y, -4.0, 4.0)
        y = y + 0.5 * torch.tanh(y)
        return F.hardswish(y) + x


class ConvBlock(nn.Module):
    """Convolution, batch norm in eval mode, ReLU."""

    def __init__(self, cin=16, cout=32):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: layer norm, attention (scores scaled and masked, softmax), residual,
    layer norm, MLP with GELU, residual."""

    def __init__(self, d=256, heads=4, hidden=1024):
        super().__init__()
        self.heads = heads
        self.ln1_w = nn.Parameter(torch.rand(d) + 0.5)
        self.ln1_b = nn.Parameter(torch.randn(d) * 0.1)
        self.wqkv = nn.Parameter(torch.randn(d, 3 * d) / d**0.5)
        self.wo = nn.Parameter(torch.randn(d, d) / d**0.5)
        self.ln2_w = nn.Parameter(torch.rand(d) + 0.5)
        self.ln2_b = nn.Parameter(torch.randn(d) * 0.1)
        self.w1 = nn.Parameter(torch.randn(d, hidden) / d**0.5)
        self.b1 = nn.Parameter(torch.randn(hidden) * 0.1)
        self.w2 = nn.Parameter(torch.randn(hidden, d) / hidden**0.5)
        self.b2 = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x, mask):
        b, t, d = x.shape
        dh = d // self.heads
        h = F.layer_norm(x, [d], self.ln1_w, self.ln1_b, 1e-5)
        q, k, v = (h @ self.wqkv).chunk(3, dim=-1)
        q = q.reshape(b, t, self.heads, dh).transpose(1, 2)
        k = k.reshape(b, t, self.heads, dh).transpose(1, 2)
        v = v.reshape(b, t, self.heads, dh).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) * (dh ** -0.5) + mask
        attn = F.softmax(scores, dim=-1)
        o = (attn @ v).transpose(1, 2).reshape(b, t, d)
        x = x + o @ self.wo
        h = F.layer_norm(x, [d], self.ln2_w, self.ln2_b, 1e-5)
        return x + F.gelu(h @ self.w1 + self.b1) @ self.w2 + self.b2


# name -> (constructor, input SPECs for the CLI)
MODELS = {
    "mlp_block": (MLPBlock, ["f32[256,512]"]),
    "activation_block": (ActivationBlock, ["f32[1024,4096]", "f32[1024,4096]"]),
    "conv_bn_relu": (ConvBlock, ["f32[8,16,56,56]"]),
    "transformer_block": (TransformerBlock, ["f32[8,128,256]", "f32[128,128]"]),
}


def make_models(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    paths = {}
    for name, (ctor, _) in MODELS.items():
        path = os.path.join(out_dir, name + ".pt")
        m = torch.jit.script(ctor().eval())
        tmp = path + ".tmp"
        m.save(tmp)
        os.replace(tmp, path)
        paths[name] = path
    return paths
