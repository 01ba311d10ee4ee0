//! Whole networks as DAGs of tensor operators, and task extraction.
//!
//! Only the operators tessel tunes (convolutions, grouped and depthwise included, dense layers,
//! batched matmuls) are nodes; an edge means one layer's output flows (possibly through elementwise ops, pooling or
//! normalisation that tessel does not tune) into another.
//!
//! ```
//! use tessel_ir::{network, DType};
//! let bert = network("bert-base-128", 1, DType::BF16).unwrap();
//! let gmacs = bert.macs() as f64 / 1e9;
//! assert!((gmacs - 11.2).abs() < 0.3);
//! ```

use petgraph::graph::{DiGraph, NodeIndex};
use serde::Serialize;

use crate::dtype::DType;
use crate::error::NetworkError;
use crate::workload::{Conv2d, ConvLayout, EpilogueSpec, Types, Workload};

/// The networks tessel knows, with a one-line description each.
pub const NETWORKS: &[(&str, &str)] = &[
    (
        "resnet50",
        "ResNet-50 v1.5, 224x224, 53 convolutions and the classifier",
    ),
    (
        "resnet18",
        "ResNet-18, 224x224, 20 convolutions and the classifier",
    ),
    (
        "resnext50",
        "ResNeXt-50 32x4d, 224x224: ResNet-50 with grouped (32) 3x3 convolutions",
    ),
    (
        "mobilenet-v1",
        "MobileNet-V1 1.0, 224x224: stem, 13 depthwise (groups = channels) + pointwise pairs and the classifier",
    ),
    (
        "mobilenet-v2",
        "MobileNet-V2 1.0, 224x224: stem, pointwise, depthwise (groups = channels) and dense layers",
    ),
    (
        "bert-tiny-128",
        "BERT-tiny encoder (2 layers, width 128, 2 heads), sequence length 128",
    ),
    (
        "bert-base-128",
        "BERT-base encoder (12 layers), sequence length 128",
    ),
    (
        "bert-base-512",
        "BERT-base encoder (12 layers), sequence length 512",
    ),
    (
        "bert-mini-128",
        "BERT-mini encoder (4 layers, width 256, 4 heads), sequence length 128",
    ),
    (
        "bert-small-128",
        "BERT-small encoder (4 layers, width 512, 8 heads), sequence length 128",
    ),
    (
        "bert-medium-128",
        "BERT-medium encoder (8 layers, width 512, 8 heads), sequence length 128",
    ),
    (
        "bert-large-128",
        "BERT-large encoder (24 layers, width 1024, 16 heads), sequence length 128",
    ),
    (
        "wide-resnet50",
        "Wide ResNet-50-2, 224x224: ResNet-50 with bottlenecks twice as wide",
    ),
    (
        "resnext101",
        "ResNeXt-101 32x8d, 224x224: 33 bottleneck blocks, grouped (32) 3x3 convolutions 8 channels a group and wider",
    ),
    (
        "vit-b16",
        "ViT-B/16, 224x224 (197 tokens), encoder and classifier",
    ),
    (
        "llama7b-prefill",
        "one LLaMA-7B decoder layer, prefill of a 512-token prompt",
    ),
    (
        "llama7b-decode",
        "one LLaMA-7B decoder layer, decoding one token against a 512-token KV cache",
    ),
];

/// The convolutional networks, which also build at another input size: `NAME-SIZE` (e.g.
/// `resnet50-256`), TenSet's way of getting more convolution shapes from one architecture.
pub const RESIZABLE_NETWORKS: &[&str] = &[
    "resnet50",
    "resnet18",
    "resnext50",
    "mobilenet-v1",
    "mobilenet-v2",
    "wide-resnet50",
    "resnext101",
];

/// The BERT encoders (Turc et al., 2019, and the original two), which take any sequence
/// length: `bert-SIZE-SEQ` (e.g. `bert-base-256`), SEQ a multiple of 16 from 16 to 1024.
const BERT_SIZES: &[(&str, EncoderSize)] = &[
    ("bert-tiny", TINY),
    ("bert-mini", MINI),
    ("bert-small", SMALL),
    ("bert-medium", MEDIUM),
    ("bert-base", BASE),
    ("bert-large", LARGE),
];

/// The sequence lengths a BERT encoder takes.
pub const SEQUENCE_LENGTHS: std::ops::RangeInclusive<u64> = 16..=1024;

/// Splits `bert-base-256` into BERT-base and 256; `None` for names that are no BERT encoder.
fn split_sequence_length(name: &str) -> Result<Option<(EncoderSize, u64)>, NetworkError> {
    let Some((base, seq)) = name.rsplit_once('-') else {
        return Ok(None);
    };
    let Some(&(_, size)) = BERT_SIZES.iter().find(|(n, _)| *n == base) else {
        return Ok(None);
    };
    size_suffix(seq, &SEQUENCE_LENGTHS, 16)
        .map(|s| Some((size, s)))
        .ok_or_else(|| NetworkError::SequenceLength {
            name: name.to_string(),
            length: seq.to_string(),
        })
}

/// The number a network name ends in (`256` of `resnet50-256`) when it is plain digits, in
/// `range` and a multiple of `multiple`.
fn size_suffix(text: &str, range: &std::ops::RangeInclusive<u64>, multiple: u64) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|s| range.contains(s) && s % multiple == 0)
}

/// The input sizes a resizable network takes: multiples of 32 (every stage halves it, five
/// times) from 64 to 1024.
pub const IMAGE_SIZES: std::ops::RangeInclusive<u64> = 64..=1024;

/// Splits `resnet50-256` into (`resnet50`, 256); a name without a size gets 224.
fn split_image_size(name: &str) -> Result<(&str, u64), NetworkError> {
    if let Some((base, size)) = name.rsplit_once('-')
        && RESIZABLE_NETWORKS.contains(&base)
        && !size.is_empty()
        && size.bytes().all(|c| c.is_ascii_digit())
    {
        return match size_suffix(size, &IMAGE_SIZES, 32) {
            Some(image) => Ok((base, image)),
            None => Err(NetworkError::ImageSize {
                name: name.to_string(),
                size: size.to_string(),
            }),
        };
    }
    Ok((name, 224))
}

/// One operator occurrence in a network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Layer {
    pub name: String,
    pub workload: Workload,
}

/// A distinct workload of a network and how many times it occurs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Task {
    pub workload: Workload,
    pub weight: u64,
}

/// A network: a DAG of layers at one batch size.
#[derive(Clone, Debug)]
pub struct Network {
    pub name: String,
    pub batch: u64,
    pub graph: DiGraph<Layer, ()>,
}

impl Network {
    /// Layers in a topological order (the network is checked to be acyclic on construction).
    pub fn layers(&self) -> Vec<&Layer> {
        petgraph::algo::toposort(&self.graph, None)
            .map(|order| order.into_iter().map(|n| &self.graph[n]).collect())
            .unwrap_or_default()
    }

    /// Distinct workloads with their weights, in order of first appearance (TVM's task
    /// extraction).
    pub fn tasks(&self) -> Vec<Task> {
        let mut tasks: Vec<Task> = Vec::new();
        for layer in self.layers() {
            match tasks.iter_mut().find(|t| t.workload == layer.workload) {
                Some(t) => t.weight += 1,
                None => tasks.push(Task {
                    workload: layer.workload,
                    weight: 1,
                }),
            }
        }
        tasks
    }

    pub fn macs(&self) -> u64 {
        self.tasks()
            .iter()
            .map(|t| t.weight.saturating_mul(t.workload.macs()))
            .fold(0, u64::saturating_add)
    }
}

/// Builds a network by name (see [`NETWORKS`]) at a batch size, with every operator in `dtype`.
pub fn network(name: &str, batch: u64, dtype: DType) -> Result<Network, NetworkError> {
    network_with_types(name, batch, Types::same(dtype))
}

/// Builds a network whose operators take `types` (e.g. u8 activations with i8 weights, as
/// quantized models run on VNNI and AMX-int8).
pub fn network_with_types(name: &str, batch: u64, types: Types) -> Result<Network, NetworkError> {
    if batch == 0 {
        return Err(NetworkError::ZeroBatch);
    }
    // Layers multiply the batch by tokens and heads (at most 2^15 together): bounded here,
    // those products cannot wrap before each layer's own limits refuse them.
    if batch > crate::workload::MAX_EXTENT {
        return Err(NetworkError::BatchTooLarge {
            batch,
            limit: crate::workload::MAX_EXTENT,
        });
    }
    let mut b = Builder {
        graph: DiGraph::new(),
        types,
    };
    let (base, image) = split_image_size(name)?;
    if let Some((size, seq)) = split_sequence_length(name)? {
        bert(&mut b, size, batch, seq);
        return finish(name, batch, b);
    }
    match base {
        "resnet50" => resnet50(&mut b, batch, image),
        "resnet18" => resnet18(&mut b, batch, image),
        "resnext50" => resnext50(&mut b, batch, image),
        "mobilenet-v1" => mobilenet_v1(&mut b, batch, image),
        "mobilenet-v2" => mobilenet_v2(&mut b, batch, image),
        "wide-resnet50" => bottleneck_resnet(&mut b, batch, image, RESNET50_BLOCKS, 1, 2),
        "resnext101" => bottleneck_resnet(&mut b, batch, image, RESNET101_BLOCKS, 32, 4),
        "vit-b16" => vit_b16(&mut b, batch),
        "llama7b-prefill" => llama7b_layer(&mut b, batch, 512, 512),
        "llama7b-decode" => llama7b_layer(&mut b, batch, 1, 512),
        _ => {
            return Err(NetworkError::Unknown {
                name: name.to_string(),
                known: NETWORKS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
                    + &format!(
                        "; {} also take an input size, e.g. resnet50-256; \
                         bert-tiny, -mini, -small, -medium, -base and -large take any \
                         sequence length, e.g. bert-base-256",
                        RESIZABLE_NETWORKS.join(", ")
                    ),
            });
        }
    }
    finish(name, batch, b)
}

/// Checks every layer of a built network.
fn finish(name: &str, batch: u64, b: Builder) -> Result<Network, NetworkError> {
    debug_assert!(!petgraph::algo::is_cyclic_directed(&b.graph));
    // A batch can make any layer too large to generate code for.
    for layer in b.graph.node_weights() {
        layer
            .workload
            .validate()
            .map_err(|source| NetworkError::Layer {
                network: name.to_string(),
                layer: layer.name.clone(),
                source: Box::new(source),
            })?;
    }
    Ok(Network {
        name: name.to_string(),
        batch,
        graph: b.graph,
    })
}

struct Builder {
    graph: DiGraph<Layer, ()>,
    types: Types,
}

impl Builder {
    /// Adds a layer fed by `inputs`.
    fn add(&mut self, name: String, w: Workload, inputs: &[NodeIndex]) -> NodeIndex {
        let w = w.with_types(self.types);
        let node = self.graph.add_node(Layer { name, workload: w });
        for &i in inputs {
            self.graph.add_edge(i, node, ());
        }
        node
    }

    #[allow(clippy::too_many_arguments)]
    fn conv(
        &mut self,
        name: String,
        input: (u64, u64, u64, u64),
        k: u64,
        r: u64,
        stride: u64,
        pad: u64,
        epilogue: EpilogueSpec,
        inputs: &[NodeIndex],
    ) -> (NodeIndex, u64) {
        self.grouped_conv(name, input, k, r, stride, pad, 1, epilogue, inputs)
    }

    /// A convolution with `groups` channel groups (`groups == c`: depthwise).
    #[allow(clippy::too_many_arguments)]
    fn grouped_conv(
        &mut self,
        name: String,
        (n, h, w, c): (u64, u64, u64, u64),
        k: u64,
        r: u64,
        stride: u64,
        pad: u64,
        groups: u64,
        epilogue: EpilogueSpec,
        inputs: &[NodeIndex],
    ) -> (NodeIndex, u64) {
        let conv = Conv2d {
            n,
            h,
            w,
            c,
            k,
            r,
            s: r,
            stride,
            pad,
            dilation: 1,
            groups,
            layout: ConvLayout::Nhwc,
        };
        let out = conv.output_hw().map_or(1, |(p, _)| p);
        let wl = Workload::Conv2d {
            conv,
            types: self.types,
            epilogue,
        };
        (self.add(name, wl, inputs), out)
    }

    fn dense(
        &mut self,
        name: String,
        m: u64,
        n: u64,
        k: u64,
        epilogue: EpilogueSpec,
        inputs: &[NodeIndex],
    ) -> NodeIndex {
        let w = Workload::dense(m, n, k, self.types.dtype).with_epilogue(epilogue);
        self.add(name, w, inputs)
    }
}

const BIAS: EpilogueSpec = EpilogueSpec {
    bias: true,
    relu: false,
    out: None,
};
const BIAS_RELU: EpilogueSpec = EpilogueSpec {
    bias: true,
    relu: true,
    out: None,
};
const NONE: EpilogueSpec = EpilogueSpec {
    bias: false,
    relu: false,
    out: None,
};

/// Bottleneck blocks per stage of ResNet-50 (and ResNeXt-50, Wide ResNet-50-2).
const RESNET50_BLOCKS: [u64; 4] = [3, 4, 6, 3];
/// Bottleneck blocks per stage of ResNet-101 (and ResNeXt-101).
const RESNET101_BLOCKS: [u64; 4] = [3, 4, 23, 3];

/// ResNet-50 v1.5 (stride on the 3x3 convolution), batch-norm folded into a bias.
fn resnet50(b: &mut Builder, n: u64, image: u64) {
    bottleneck_resnet(b, n, image, RESNET50_BLOCKS, 1, 1);
}

/// ResNeXt-50 32x4d: ResNet-50 with 3x3 convolutions of 32 groups, twice as wide.
fn resnext50(b: &mut Builder, n: u64, image: u64) {
    bottleneck_resnet(b, n, image, RESNET50_BLOCKS, 32, 2);
}

/// The stem and the stages of the bottleneck ResNets (ResNet-50, ResNeXt-50/101, Wide
/// ResNet-50-2): `blocks` per stage, whose 3x3 convolution has `groups` groups and `widen`
/// times the ResNet-50 width (torchvision's `width_per_group * groups / 64`).
fn bottleneck_resnet(
    b: &mut Builder,
    n: u64,
    image: u64,
    blocks: [u64; 4],
    groups: u64,
    widen: u64,
) {
    let (stem, _) = b.conv(
        "conv1".into(),
        (n, image, image, 3),
        64,
        7,
        2,
        3,
        BIAS_RELU,
        &[],
    );
    // 3x3/2 max pooling: 112 -> 56.
    let mut x = stem;
    let (mut hw, mut c) = (image / 4, 64);
    let stages = [(64, 1), (128, 2), (256, 2), (512, 2)];
    for (stage, (&blocks, &(planes, stride))) in blocks.iter().zip(&stages).enumerate() {
        let (width, out_c) = (planes * widen, planes * 4);
        for blk in 0..blocks {
            let s = if blk == 0 { stride } else { 1 };
            let p = format!("layer{}.{}", stage + 1, blk);
            let (a, _) = b.conv(
                format!("{p}.conv1"),
                (n, hw, hw, c),
                width,
                1,
                1,
                0,
                BIAS_RELU,
                &[x],
            );
            let (m, out_hw) = b.grouped_conv(
                format!("{p}.conv2"),
                (n, hw, hw, width),
                width,
                3,
                s,
                1,
                groups,
                BIAS_RELU,
                &[a],
            );
            let (z, _) = b.conv(
                format!("{p}.conv3"),
                (n, out_hw, out_hw, width),
                out_c,
                1,
                1,
                0,
                BIAS,
                &[m],
            );
            if blk == 0 {
                let (d, _) = b.conv(
                    format!("{p}.downsample"),
                    (n, hw, hw, c),
                    out_c,
                    1,
                    s,
                    0,
                    BIAS,
                    &[x],
                );
                b.graph.add_edge(d, z, ());
            } else {
                b.graph.add_edge(x, z, ());
            }
            x = z;
            hw = out_hw;
            c = out_c;
        }
    }
    b.dense("fc".into(), n, 1000, 2048, BIAS, &[x]);
}

/// ResNet-18: basic blocks of two 3x3 convolutions.
fn resnet18(b: &mut Builder, n: u64, image: u64) {
    let (mut x, _) = b.conv(
        "conv1".into(),
        (n, image, image, 3),
        64,
        7,
        2,
        3,
        BIAS_RELU,
        &[],
    );
    let (mut hw, mut c) = (image / 4, 64);
    for (stage, &(out_c, stride)) in [(64, 1), (128, 2), (256, 2), (512, 2)].iter().enumerate() {
        for blk in 0..2 {
            let s = if blk == 0 { stride } else { 1 };
            let p = format!("layer{}.{}", stage + 1, blk);
            let (a, out_hw) = b.conv(
                format!("{p}.conv1"),
                (n, hw, hw, c),
                out_c,
                3,
                s,
                1,
                BIAS_RELU,
                &[x],
            );
            let (z, _) = b.conv(
                format!("{p}.conv2"),
                (n, out_hw, out_hw, out_c),
                out_c,
                3,
                1,
                1,
                BIAS,
                &[a],
            );
            if s != 1 || c != out_c {
                let (d, _) = b.conv(
                    format!("{p}.downsample"),
                    (n, hw, hw, c),
                    out_c,
                    1,
                    s,
                    0,
                    BIAS,
                    &[x],
                );
                b.graph.add_edge(d, z, ());
            } else {
                b.graph.add_edge(x, z, ());
            }
            x = z;
            hw = out_hw;
            c = out_c;
        }
    }
    b.dense("fc".into(), n, 1000, 512, BIAS, &[x]);
}

/// MobileNet-V2's inverted-residual settings: (expansion t, channels c, repeats n, stride s).
pub const MOBILENET_V2_BLOCKS: [(u64, u64, u64, u64); 7] = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
];

/// MobileNet-V1's depthwise-separable blocks: (depthwise stride, pointwise output channels).
pub const MOBILENET_V1_BLOCKS: [(u64, u64); 13] = [
    (1, 64),
    (2, 128),
    (1, 128),
    (2, 256),
    (1, 256),
    (2, 512),
    (1, 512),
    (1, 512),
    (1, 512),
    (1, 512),
    (1, 512),
    (2, 1024),
    (1, 1024),
];

/// The 3x3 stride-2 stem both MobileNets share: 3 channels to 32.
fn mobilenet_stem(b: &mut Builder, n: u64, image: u64) -> (NodeIndex, u64) {
    b.conv(
        "stem".into(),
        (n, image, image, 3),
        32,
        3,
        2,
        1,
        BIAS_RELU,
        &[],
    )
}

fn mobilenet_v1(b: &mut Builder, n: u64, image: u64) {
    let (mut x, mut hw) = mobilenet_stem(b, n, image);
    let mut c = 32;
    for (i, &(stride, out_c)) in MOBILENET_V1_BLOCKS.iter().enumerate() {
        let (d, out_hw) = b.grouped_conv(
            format!("block{i}.depthwise"),
            (n, hw, hw, c),
            c,
            3,
            stride,
            1,
            c,
            BIAS_RELU,
            &[x],
        );
        (x, _) = b.conv(
            format!("block{i}.pointwise"),
            (n, out_hw, out_hw, c),
            out_c,
            1,
            1,
            0,
            BIAS_RELU,
            &[d],
        );
        hw = out_hw;
        c = out_c;
    }
    b.dense("classifier".into(), n, 1000, c, BIAS, &[x]);
}

fn mobilenet_v2(b: &mut Builder, n: u64, image: u64) {
    let (mut x, mut hw) = mobilenet_stem(b, n, image);
    let mut c = 32;
    for (i, &(t, out_c, repeats, stride)) in MOBILENET_V2_BLOCKS.iter().enumerate() {
        for r in 0..repeats {
            let s = if r == 0 { stride } else { 1 };
            let p = format!("block{i}.{r}");
            let hidden = c * t;
            let mut y = x;
            if t != 1 {
                (y, _) = b.conv(
                    format!("{p}.expand"),
                    (n, hw, hw, c),
                    hidden,
                    1,
                    1,
                    0,
                    BIAS_RELU,
                    &[x],
                );
            }
            let (d, out_hw) = b.grouped_conv(
                format!("{p}.depthwise"),
                (n, hw, hw, hidden),
                hidden,
                3,
                s,
                1,
                hidden,
                BIAS_RELU,
                &[y],
            );
            let (z, _) = b.conv(
                format!("{p}.project"),
                (n, out_hw, out_hw, hidden),
                out_c,
                1,
                1,
                0,
                BIAS,
                &[d],
            );
            if s == 1 && c == out_c {
                b.graph.add_edge(x, z, ());
            }
            x = z;
            hw = out_hw;
            c = out_c;
        }
    }
    let (head, _) = b.conv(
        "head".into(),
        (n, hw, hw, c),
        1280,
        1,
        1,
        0,
        BIAS_RELU,
        &[x],
    );
    b.dense("classifier".into(), n, 1000, 1280, BIAS, &[head]);
}

/// A transformer encoder's sizes: model width, heads, feed-forward width, layers.
#[derive(Clone, Copy)]
struct EncoderSize {
    d: u64,
    heads: u64,
    ffn: u64,
    layers: u64,
}

impl EncoderSize {
    /// A BERT-style encoder: `layers` layers of width `d` with `heads` heads and a
    /// feed-forward layer four times as wide.
    const fn bert(layers: u64, d: u64, heads: u64) -> EncoderSize {
        EncoderSize {
            d,
            heads,
            ffn: 4 * d,
            layers,
        }
    }
}

/// BERT-base and ViT-B.
const BASE: EncoderSize = EncoderSize::bert(12, 768, 12);
/// BERT-tiny (Turc et al., 2019: L=2, H=128, A=2), one of TenSet's test networks.
const TINY: EncoderSize = EncoderSize::bert(2, 128, 2);
/// BERT-mini (L=4, H=256, A=4).
const MINI: EncoderSize = EncoderSize::bert(4, 256, 4);
/// BERT-small (L=4, H=512, A=8).
const SMALL: EncoderSize = EncoderSize::bert(4, 512, 8);
/// BERT-medium (L=8, H=512, A=8).
const MEDIUM: EncoderSize = EncoderSize::bert(8, 512, 8);
/// BERT-large (L=24, H=1024, A=16).
const LARGE: EncoderSize = EncoderSize::bert(24, 1024, 16);

/// A transformer encoder layer stack (BERT, ViT): `tokens` per sequence.
fn encoder(
    b: &mut Builder,
    prefix: &str,
    size: EncoderSize,
    batch: u64,
    tokens: u64,
    input: Option<NodeIndex>,
) -> NodeIndex {
    let EncoderSize {
        d,
        heads,
        ffn,
        layers,
    } = size;
    let hd = d / heads;
    let m = batch * tokens;
    let mut x: Vec<NodeIndex> = input.into_iter().collect();
    for l in 0..layers {
        let p = format!("{prefix}.{l}");
        let q = b.dense(format!("{p}.query"), m, d, d, BIAS, &x);
        let k = b.dense(format!("{p}.key"), m, d, d, BIAS, &x);
        let v = b.dense(format!("{p}.value"), m, d, d, BIAS, &x);
        let scores = b.add(
            format!("{p}.scores"),
            Workload::bmm(batch * heads, tokens, tokens, hd, b.types.dtype),
            &[q, k],
        );
        let ctx = b.add(
            format!("{p}.context"),
            Workload::bmm(batch * heads, tokens, hd, tokens, b.types.dtype),
            &[scores, v],
        );
        let o = b.dense(format!("{p}.output"), m, d, d, BIAS, &[ctx]);
        let f1 = b.dense(format!("{p}.ffn1"), m, ffn, d, BIAS, &[o]);
        let f2 = b.dense(format!("{p}.ffn2"), m, d, ffn, BIAS, &[f1]);
        x = vec![f2];
    }
    x[0]
}

fn bert(b: &mut Builder, size: EncoderSize, batch: u64, seq: u64) {
    encoder(b, "encoder", size, batch, seq, None);
}

fn vit_b16(b: &mut Builder, batch: u64) {
    let (patch, _) = b.conv(
        "patch_embed".into(),
        (batch, 224, 224, 3),
        768,
        16,
        16,
        0,
        BIAS,
        &[],
    );
    let last = encoder(b, "encoder", BASE, batch, 197, Some(patch));
    b.dense("head".into(), batch, 1000, 768, BIAS, &[last]);
}

/// One LLaMA-7B decoder layer: `new_tokens` per sequence attending to `context` positions.
fn llama7b_layer(b: &mut Builder, batch: u64, new_tokens: u64, context: u64) {
    let (d, heads, ffn) = (4096, 32, 11008);
    let hd = d / heads;
    let m = batch * new_tokens;
    let q = b.dense("q_proj".into(), m, d, d, NONE, &[]);
    let k = b.dense("k_proj".into(), m, d, d, NONE, &[]);
    let v = b.dense("v_proj".into(), m, d, d, NONE, &[]);
    let dt = b.types.dtype;
    let scores = b.add(
        "scores".into(),
        Workload::bmm(batch * heads, new_tokens, context, hd, dt),
        &[q, k],
    );
    let ctx = b.add(
        "context".into(),
        Workload::bmm(batch * heads, new_tokens, hd, context, dt),
        &[scores, v],
    );
    let o = b.dense("o_proj".into(), m, d, d, NONE, &[ctx]);
    let gate = b.dense("gate_proj".into(), m, ffn, d, NONE, &[o]);
    let up = b.dense("up_proj".into(), m, ffn, d, NONE, &[o]);
    b.dense("down_proj".into(), m, d, ffn, NONE, &[gate, up]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gmacs(name: &str, batch: u64) -> f64 {
        network(name, batch, DType::BF16).unwrap().macs() as f64 / 1e9
    }

    #[test]
    fn resnet50_is_about_4_1_gmacs() {
        // torchvision's ResNet-50 (v1.5): 4.09 GMACs at batch 1.
        let g = gmacs("resnet50", 1);
        assert!((g - 4.09).abs() < 0.05, "{g}");
        let net = network("resnet50", 1, DType::BF16).unwrap();
        assert_eq!(net.graph.node_count(), 54);
        assert!(
            net.tasks().len() < 54,
            "repeated layers merge into weighted tasks"
        );
        assert!((gmacs("resnet50", 8) - 8.0 * g).abs() < 1e-6);
    }

    #[test]
    fn bert_base_is_about_11_gmacs_per_sequence() {
        let g = gmacs("bert-base-128", 1);
        assert!((g - 11.17).abs() < 0.1, "{g}");
        let tasks = network("bert-base-128", 1, DType::BF16).unwrap().tasks();
        // query/key/value/output share one shape: one task with weight 4 per layer.
        let qkvo = tasks
            .iter()
            .find(|t| t.workload == Workload::dense(128, 768, 768, DType::BF16).with_epilogue(BIAS))
            .unwrap();
        assert_eq!(qkvo.weight, 48);
        // Seq 512: the dense part grows 4x, attention 16x.
        let g512 = gmacs("bert-base-512", 1);
        assert!(
            (g512 - (4.0 * (11.17 - 0.302) + 16.0 * 0.302)).abs() < 0.2,
            "{g512}"
        );
    }

    #[test]
    fn vit_b16_is_about_17_6_gmacs() {
        let g = gmacs("vit-b16", 1);
        assert!((g - 17.56).abs() < 0.1, "{g}");
    }

    #[test]
    fn mobilenet_v2_is_about_300_mmacs_with_its_depthwise_layers() {
        // Sandler et al.: 300M multiply-adds.
        let m = gmacs("mobilenet-v2", 1) * 1e3;
        assert!((m - 300.0).abs() < 9.0, "{m}");
        let net = network("mobilenet-v2", 1, DType::F32).unwrap();
        let depthwise = net
            .layers()
            .into_iter()
            .filter(|l| l.name.ends_with(".depthwise"))
            .count();
        assert_eq!(depthwise, 17);
    }

    #[test]
    fn mobilenet_v1_is_about_569_mmacs() {
        // Howard et al., Table 1 and 8: 569M multiply-adds (1.0 MobileNet-224).
        let m = gmacs("mobilenet-v1", 1) * 1e3;
        assert!((m - 569.0).abs() < 6.0, "{m}");
        let net = network("mobilenet-v1", 1, DType::F32).unwrap();
        let layers = net.layers();
        assert_eq!(layers.len(), 28, "stem, 13 x 2 and the classifier");
        let depthwise = layers
            .iter()
            .filter(|l| l.name.ends_with(".depthwise"))
            .count();
        assert_eq!(depthwise, 13);
    }

    #[test]
    fn resnext50_and_resnet18_match_torchvision() {
        // torchvision: ResNeXt-50 32x4d 4.23 GMACs, ResNet-18 1.81.
        let g = gmacs("resnext50", 1);
        assert!((g - 4.23).abs() < 0.05, "{g}");
        let g = gmacs("resnet18", 1);
        assert!((g - 1.81).abs() < 0.03, "{g}");
        let tasks = network("resnext50", 1, DType::F32).unwrap().tasks();
        assert!(
            tasks
                .iter()
                .any(|t| t.workload.to_string().contains("groups=32"))
        );
    }

    #[test]
    fn bert_tiny_counts_its_two_small_layers() {
        // Per layer: 4 projections 128x128x128, attention 2 x (2 heads x 128 x 128 x 64),
        // feed-forward 2 x 128x512x128.
        let per_layer =
            4.0 * 128f64.powi(3) + 2.0 * 2.0 * 128.0 * 128.0 * 64.0 + 2.0 * 128.0 * 512.0 * 128.0;
        let g = gmacs("bert-tiny-128", 1) * 1e9;
        assert!((g - 2.0 * per_layer).abs() < 1.0, "{g}");
    }

    #[test]
    fn wide_resnet50_and_resnext101_match_torchvision() {
        // torchvision's wide_resnet50_2: 11.40 GFLOPS (multiply-adds); resnext101_32x8d: 16.41.
        let g = gmacs("wide-resnet50", 1);
        assert!((g - 11.40).abs() < 0.1, "{g}");
        let g = gmacs("resnext101", 1);
        assert!((g - 16.41).abs() < 0.15, "{g}");
        let net = network("resnext101", 1, DType::F32).unwrap();
        assert_eq!(net.graph.node_count(), 1 + 33 * 3 + 4 + 1);
        // Its 3x3 convolutions have 8 channels a group in the first stage, 64 in the last.
        let grouped: Vec<String> = net
            .tasks()
            .iter()
            .map(|t| t.workload.to_string())
            .filter(|t| t.contains("groups=32"))
            .collect();
        assert!(grouped.iter().any(|t| t.contains("h=56,w=56,c=256,k=256")));
        assert!(
            grouped
                .iter()
                .any(|t| t.contains("h=14,w=14,c=2048,k=2048"))
        );
    }

    #[test]
    fn bert_encoders_take_their_size_and_any_sequence_length() {
        // BERT-large at 128: 24 layers of 4 projections 1024^2, the feed-forward pair
        // 1024 x 4096 and attention 2 x 16 heads x 128 x 64, per token.
        let per_layer = 128.0 * (4.0 * 1024.0 * 1024.0 + 2.0 * 1024.0 * 4096.0)
            + 2.0 * 16.0 * 128.0 * 128.0 * 64.0;
        let g = gmacs("bert-large-128", 1) * 1e9;
        assert!((g - 24.0 * per_layer).abs() < 1.0, "{g}");
        // Medium is small with twice the layers: the same tasks, each twice as often.
        let tasks = |name: &str| network(name, 1, DType::F32).unwrap().tasks();
        let (small, medium) = (tasks("bert-small-128"), tasks("bert-medium-128"));
        assert_eq!(small.len(), medium.len());
        for (s, m) in small.iter().zip(&medium) {
            assert_eq!((&s.workload, 2 * s.weight), (&m.workload, m.weight));
        }
        let has_task = |name: &str, prefix: &str| {
            tasks(name)
                .iter()
                .any(|t| t.workload.to_string().starts_with(prefix))
        };
        // The sequence length is the dense layers' m.
        assert!(has_task("bert-base-256", "dense:m=256,n=3072,k=768"));
        // The names that were fixed before build as they did.
        assert!(has_task("bert-base-128", "dense:m=128,n=3072,k=768"));
        refused_by_name(
            &[
                "bert-base-100",
                "bert-base-0",
                "bert-base-2048",
                "bert-large-",
                "bert-base-1e3",
            ],
            "multiple of 16",
        );
        let err = network("bert-huge-128", 1, DType::F32)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown network") && err.contains("bert-base-256"),
            "{err}"
        );
    }

    #[test]
    fn there_are_ten_networks_and_each_builds() {
        assert!(NETWORKS.len() >= 10);
        for (name, _) in NETWORKS {
            assert!(network(name, 1, DType::BF16).unwrap().macs() > 0, "{name}");
        }
    }

    #[test]
    fn llama_layer_matches_its_parameter_count() {
        // 4 x 4096^2 + 3 x 4096 x 11008 = 202.4M weights: one MAC each per token.
        let params = 4.0 * 4096.0 * 4096.0 + 3.0 * 4096.0 * 11008.0;
        let attention_decode = 2.0 * 32.0 * 512.0 * 128.0;
        let g = gmacs("llama7b-decode", 1) * 1e9;
        assert!((g - params - attention_decode).abs() < 1.0);
        let p = gmacs("llama7b-prefill", 1) * 1e9;
        assert!((p - 512.0 * params - 512.0 * attention_decode).abs() < 1.0);
    }

    #[test]
    fn a_network_at_another_input_size_has_its_own_convolutions() {
        // MACs grow with the pixels; the classifier stays the same task.
        let (g224, g256) = (gmacs("resnet50", 1), gmacs("resnet50-256", 1));
        assert!(
            (g256 / g224 - (256.0f64 / 224.0).powi(2)).abs() < 0.01,
            "{g256}"
        );
        let spec = |name: &str| -> Vec<String> {
            network(name, 1, DType::F32)
                .unwrap()
                .tasks()
                .iter()
                .map(|t| t.workload.to_string())
                .collect()
        };
        let (small, large) = (spec("resnet50"), spec("resnet50-256"));
        assert_eq!(small.len(), large.len());
        let shared: Vec<_> = large.iter().filter(|t| small.contains(t)).collect();
        assert_eq!(shared.len(), 1, "only the classifier is shared: {shared:?}");
        assert!(shared[0].starts_with("dense"));
        assert!(large.iter().any(|t| t.contains("h=256,w=256,c=3")));
        // The default size is 224.
        assert_eq!(spec("mobilenet-v2-224"), spec("mobilenet-v2"));
        for name in RESIZABLE_NETWORKS {
            assert!(gmacs(&format!("{name}-160"), 1) > 0.0, "{name}");
        }
    }

    /// Each name is refused with an error that names it and says `why`.
    fn refused_by_name(names: &[&str], why: &str) {
        for bad in names {
            let err = network(bad, 1, DType::F32).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains(why), "{err}");
        }
    }

    #[test]
    fn input_sizes_out_of_range_are_refused_by_name() {
        refused_by_name(
            &[
                "resnet50-250",
                "resnet50-32",
                "resnet50-2048",
                "resnet50-99999999999999999999",
            ],
            "multiple of 32",
        );
        // Only the convolutional networks are resizable.
        let err = network("vit-b16-256", 1, DType::F32)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown network"), "{err}");
        assert!(network("resnet50-", 1, DType::F32).is_err());
    }

    #[test]
    fn a_batch_that_would_wrap_a_layer_is_refused() {
        // (2^55 + 1) x 512 tokens wraps to 512 in u64: refused before any layer is built.
        for name in ["bert-base-512", "llama7b-prefill", "resnet50"] {
            let err = network(name, (1 << 55) + 1, DType::F32)
                .unwrap_err()
                .to_string();
            assert!(err.contains("batch") && err.contains("2147483648"), "{err}");
        }
        assert!(network("bert-tiny-128", 8, DType::F32).is_ok());
    }

    #[test]
    fn unknown_networks_are_named() {
        let err = network("resnet51", 1, DType::BF16).unwrap_err().to_string();
        assert!(err.contains("resnet51") && err.contains("resnet50"));
        assert!(network("resnet50", 0, DType::BF16).is_err());
    }
}
