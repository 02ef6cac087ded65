//! The plan (every tensor of the pack, in file order) and the per-layer producer that `convert` and `verify --source` share.

use super::refusals::checked_layouts;
use super::tp::{self, Rule};
use super::*;
use crate::GgmlType;
use crate::converters::layouts::{Layout, Proj};
use crate::error::{Error, Result};
use crate::model::lora::Lora;
use crate::model::{Activation, FfnLayer, FfnWeight, Model};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A planned tensor: where its bytes come from.
pub(super) enum Item {
    /// Copied byte for byte from source tensor `src`, in the device segment or on the host
    /// ([`passthrough`] derives its type, shape and entry: a pack of 100k small tensors held
    /// each of those once per item before).
    Passthrough { src: usize, device: bool },
    /// Part `part` of layout `layout` of projection `proj` of layer `layer` (of rank `rank`'s
    /// slice in a tensor-parallel pack).
    Blob(Box<Blob>),
    /// A rank's slice of an attention tensor.
    Slice(Box<Slice>),
}

// Held once per tensor of the pack: the boxed variants keep 100k passthrough items at 16 bytes
// each (they took 64).
const _: () = assert!(std::mem::size_of::<Item>() == 16);

/// Part `part` of layout `layout` of projection `proj` of layer `layer` (of rank `rank`'s
/// slice in a tensor-parallel pack).
pub(super) struct Blob {
    pub layer: usize,
    pub proj: Proj,
    pub layout: Layout,
    pub part: &'static str,
    pub rank: Option<u32>,
}

/// Rank `entry.tp.rank`'s slice of attention tensor `src`, as `plan` cuts it.
pub(super) struct Slice {
    pub src: usize,
    pub plan: tp::SlicePlan,
    pub ty: GgmlType,
    pub ne: Vec<u64>,
    pub entry: TensorEntry,
}

/// The source tensors of every dense FFN layer (weights and their companions), each weight's
/// shape checked against the hidden and intermediate sizes.
fn checked_ffn_sources(model: &Model, hidden: u64, inter: u64) -> Result<HashSet<usize>> {
    let mut ffn_sources = HashSet::new();
    for l in &model.ffn_layers {
        for (w, want) in [
            (&l.gate, [inter, hidden]),
            (&l.up, [inter, hidden]),
            (&l.down, [hidden, inter]),
        ] {
            let s = model.weight_shape(w)?;
            if s != want {
                return Err(Error::Quantized {
                    file: model.file_of(w.main()),
                    tensor: model.tensors[w.main()].name.to_string(),
                    reason: format!("shape {s:?} but hidden/intermediate size say {want:?}"),
                });
            }
            ffn_sources.extend(companions(w));
        }
    }
    Ok(ffn_sources)
}

/// Under `--tp n` (n > 1), the split rule of every attention tensor, and the head counts they
/// are split by (checked against n); none for one rank or a model without attention tensors.
type Rules = (HashMap<usize, tp::Rule>, Option<(u64, u64)>);
fn attention_rules(model: &Model, ffn_sources: &HashSet<usize>, n: u32) -> Result<Rules> {
    let file = model.path.display().to_string();
    let mut rules = HashMap::new();
    if n > 1 {
        for (i, t) in model.tensors.iter().enumerate() {
            if !ffn_sources.contains(&i)
                && let Some(rule) = tp::attention_rule(&file, &t.name)?
            {
                // bitsandbytes' codes are the weight flattened (4-bit) or come with companions
                // the cut does not follow (`SCB`, the absmax): refused by name, not cut.
                if let Some(FfnWeight::Bnb4 { .. } | FfnWeight::BnbInt8 { .. }) =
                    model.quantized_weight_named(&t.name)
                {
                    return Err(Error::Unsupported {
                        file,
                        reason: format!(
                            "{}: --tp does not split bitsandbytes-quantized attention weights (convert without --tp)",
                            t.name
                        ),
                    });
                }
                rules.insert(i, rule);
            }
        }
    }
    if rules.is_empty() {
        return Ok((rules, None));
    }
    let h = model.heads.ok_or_else(|| Error::Unsupported {
        file: file.clone(),
        reason: format!(
            "--tp {n}: the model has attention tensors but its metadata gives no head counts"
        ),
    })?;
    tp::check_heads(&file, h, n)?;
    Ok((rules, Some(h)))
}

/// A passthrough source tensor's name is not one of the names the pack gives its own tensors
/// (pads, the table names of long names), and its table name ([`table_name`]) is not another
/// long name's (`tables`: the table names of long names so far, with their tensors).
fn check_source_name(model: &Model, i: usize, tables: &mut HashMap<String, usize>) -> Result<()> {
    let t = &model.tensors[i];
    let reason = if t.name.starts_with(PAD_PREFIX) {
        // The pack's own pad tensors are named so; a source tensor may not be.
        format!("the prefix {PAD_PREFIX} is reserved for a pack's pad tensors")
    } else if t.name.starts_with(LONG_PREFIX) {
        format!("the prefix {LONG_PREFIX} is reserved for the table names of long names")
    } else if t.name.len() <= MAX_NAME_LEN {
        return Ok(());
    } else {
        match tables.insert(table_name(&t.name).into_owned(), i) {
            None => return Ok(()),
            Some(j) => format!(
                "its table name {} (this name is over {MAX_NAME_LEN} bytes) is also {}'s",
                table_name(&t.name),
                model.tensors[j].name
            ),
        }
    };
    Err(Error::Tensor {
        file: model.file_of(i),
        tensor: t.name.to_string(),
        field: "name",
        reason,
    })
}

/// Each rank's slice of attention tensor `i`, cut by `rule` over `heads`, in rank order.
fn rank_slices(
    model: &Model,
    i: usize,
    rule: tp::Rule,
    heads: (u64, u64),
    n: u32,
) -> Result<Vec<Item>> {
    let t = &model.tensors[i];
    let mut out = Vec::with_capacity(n as usize);
    for r in 0..n {
        let plan = tp::plan_for(model, i, rule, heads, n, r)?
            .expect("every rank cuts a tensor rank 0 cuts");
        let flat = t.shape.len() == 1;
        let (ty, ne, source_shape) = match t.dtype.as_ggml() {
            Some(ty) if flat => (ty, vec![plan.shape[0]], None),
            Some(ty) => (ty, vec![plan.shape[1], plan.shape[0]], None),
            None => {
                let s = if flat {
                    vec![plan.shape[0]]
                } else {
                    plan.shape.to_vec()
                };
                (GgmlType::I8, vec![plan.bytes], Some(s.into()))
            }
        };
        let entry = TensorEntry {
            name: tp::slice_name(&t.name, r).into(),
            source_shape,
            bytes: plan.bytes,
            tp: Some(Box::new(TpSlice {
                rank: r,
                rule: rule.name().into(),
                source: t.name.to_string(),
                range: plan.range,
                pad: 0,
            })),
            ..passthrough(model, i, true)
        };
        out.push(Item::Slice(Box::new(Slice {
            src: i,
            plan,
            ty,
            ne,
            entry,
        })));
    }
    Ok(out)
}

/// The blobs of layer `layer` (of rank `rank`'s slice): every part of every projection of
/// every layout, in registry order; LoRA only for the projections its adapter targets.
fn layer_blob_items(
    layer: usize,
    rank: Option<u32>,
    layouts: &[Layout],
    lora: Option<&Lora>,
    opts: &ConvertOptions,
) -> Vec<Item> {
    let mut items = Vec::new();
    for &layout in layouts {
        for &proj in layout.spec().projections() {
            if layout == Layout::Lora && !lora.is_some_and(|a| a.targets(layer, proj)) {
                continue; // not targeted: served as identity
            }
            for &part in layout.spec().parts(proj, opts.q4k_down) {
                items.push(Item::Blob(Box::new(Blob {
                    layer,
                    proj,
                    layout,
                    part,
                    rank,
                })));
            }
        }
    }
    items
}

/// Passthrough source tensor `i`'s pack type and `ne`: a type ggml has keeps it; any other
/// becomes an I8 blob of its bytes.
pub(super) fn passthrough_type(model: &Model, i: usize) -> (GgmlType, Vec<u64>) {
    let t = &model.tensors[i];
    match t.dtype.as_ggml() {
        Some(ty) => (ty, t.shape.iter().rev().copied().collect()),
        None => (GgmlType::I8, vec![t.bytes]),
    }
}

/// Passthrough source tensor `i`'s manifest entry, its checksum not yet computed (0).
pub(super) fn passthrough(model: &Model, i: usize, device: bool) -> TensorEntry {
    let t = &model.tensors[i];
    TensorEntry {
        name: t.name.clone(),
        ffn: None,
        device,
        source_type: t.dtype.name(),
        source_shape: t
            .dtype
            .as_ggml()
            .is_none()
            .then(|| t.shape.as_slice().into()),
        bytes: t.bytes,
        xxh3: 0,
        tp: None,
    }
}

/// Per (layout, projection) while producing: (sum of relative errors, worst, its layer, layers).
type FidelityAcc = (f64, f64, usize, usize);

/// Everything the writer and `verify --source` share: the plan and the per-layer producer.
pub struct Plan<'m> {
    model: &'m Model,
    opts: ConvertOptions,
    layouts: Vec<Layout>,
    lora: Option<Lora>,
    pub(super) items: Vec<Item>,
    ffn_sources: HashSet<usize>,
    /// Position in `model.ffn_layers` of each FFN layer index (plan and progress look layers up
    /// by index once per blob; a scan there made convert quadratic in the layer count).
    pub(super) layer_pos: HashMap<usize, usize>,
    hidden: u64,
    inter: u64,
    activation: Activation,
    /// Rank count (1: not tensor-parallel), each rank's intermediate range and the head counts
    /// attention is split by.
    tp: u32,
    inter_ranges: Vec<[u64; 2]>,
    heads: Option<(u64, u64)>,
    /// Per (layout, projection): (sum of relative errors, worst, its layer, layers), filled by
    /// the producer as it encodes (no second pass over the source).
    fidelity: std::sync::Mutex<BTreeMap<(Layout, Proj), FidelityAcc>>,
}

impl<'m> Plan<'m> {
    /// Check the options against the model and list every tensor the pack will hold.
    pub fn new(model: &'m Model, opts: &ConvertOptions) -> Result<Plan<'m>> {
        let file = model.path.display().to_string();
        let bad = |reason: String| Error::Unsupported {
            file: file.clone(),
            reason,
        };
        let activation = model.activation.unwrap_or(Activation::Silu);
        let layouts = checked_layouts(model, opts, activation).map_err(bad)?;
        let lora = opts
            .lora
            .as_deref()
            .map(|d| Lora::open(d, model))
            .transpose()?;
        let hidden = model.hidden_size.unwrap_or(0);
        let inter = model.intermediate_size.unwrap_or(0);
        let ffn_sources = checked_ffn_sources(model, hidden, inter)?;
        let n = opts.tp;
        if !(1..=tp::MAX_TP_RANKS).contains(&n) {
            return Err(bad(format!("--tp {n}: 1 to {} ranks", tp::MAX_TP_RANKS)));
        }
        if inter < n as u64 {
            return Err(bad(format!(
                "--tp {n}: the intermediate size {inter} is smaller than the rank count"
            )));
        }
        let inter_ranges: Vec<[u64; 2]> = (0..n).map(|r| tp::rank_range(inter, n, r)).collect();
        // Attention split by heads: the rule of every passthrough tensor, checked before
        // anything is written.
        let (rules, heads) = attention_rules(model, &ffn_sources, n)?;
        // File order: host tensors (outside the segment), then the device segment in layer
        // order: embeddings, each layer's passthrough tensors then its FFN blobs, the rest. In
        // a tensor-parallel pack the replicated tensors come first (embeddings, each layer's
        // unsplit tensors, the rest), then each rank's segment in layer order: the layer's
        // attention slices then its FFN blobs.
        let mut host = Vec::new();
        let (mut first, mut last) = (Vec::new(), Vec::new());
        let mut layers: BTreeMap<usize, Vec<Item>> = BTreeMap::new();
        let mut ranked: Vec<BTreeMap<usize, Vec<Item>>> = (0..n).map(|_| BTreeMap::new()).collect();
        let mut used = vec![false; opts.host_tensors.len()];
        let mut long_names = HashMap::new();
        for (i, t) in model.tensors.iter().enumerate() {
            if ffn_sources.contains(&i) {
                continue;
            }
            check_source_name(model, i, &mut long_names)?;
            let mut device = true;
            for (p, u) in opts.host_tensors.iter().zip(used.iter_mut()) {
                if glob_match(p, &t.name) {
                    device = false;
                    *u = true;
                }
            }
            let cut = match (device, rules.get(&i), heads, layer_of(&t.name)) {
                (true, Some(&rule), Some(h), Some(l)) => tp::plan_for(model, i, rule, h, n, 0)?
                    .is_some()
                    .then_some((rule, h, l)),
                _ => None,
            };
            if let Some((rule, h, l)) = cut {
                for (r, item) in rank_slices(model, i, rule, h, n)?.into_iter().enumerate() {
                    ranked[r].entry(l).or_default().push(item);
                }
                continue;
            }
            let item = Item::Passthrough { src: i, device };
            if !device {
                host.push(item);
            } else if let Some(l) = layer_of(&t.name) {
                layers.entry(l).or_default().push(item);
            } else if t.name.contains("embd") || t.name.contains("embed") {
                first.push(item);
            } else {
                last.push(item);
            }
        }
        if let Some(p) = used.iter().position(|u| !u) {
            return Err(bad(format!(
                "--host-tensors {}: matches no passthrough tensor (FFN weights are always repacked into the device segment)",
                opts.host_tensors[p]
            )));
        }
        let ranks: Vec<Option<u32>> = if n == 1 {
            vec![None]
        } else {
            (0..n).map(Some).collect()
        };
        for l in &model.ffn_layers {
            for &rank in &ranks {
                let items = match rank {
                    None => layers.entry(l.index).or_default(),
                    Some(r) => ranked[r as usize].entry(l.index).or_default(),
                };
                items.extend(layer_blob_items(
                    l.index,
                    rank,
                    &layouts,
                    lora.as_ref(),
                    opts,
                ));
            }
        }
        let mut items = host;
        items.extend(first);
        items.extend(layers.into_values().flatten());
        items.extend(last);
        for r in ranked {
            items.extend(r.into_values().flatten());
        }
        let layer_pos = model
            .ffn_layers
            .iter()
            .enumerate()
            .map(|(p, l)| (l.index, p))
            .collect();
        Ok(Plan {
            model,
            opts: opts.clone(),
            layouts,
            lora,
            items,
            ffn_sources,
            layer_pos,
            hidden,
            inter,
            activation,
            tp: n,
            inter_ranges,
            heads,
            fidelity: Default::default(),
        })
    }

    /// Produce every tensor in file order, calling `sink(name, bytes, entry)`; one layer's
    /// weights are held at a time.
    pub fn produce(
        &self,
        mut sink: impl FnMut(&str, &[u8], TensorEntry) -> Result<()>,
    ) -> Result<()> {
        let m = self.model;
        let mut i = 0;
        while i < self.items.len() {
            match &self.items[i] {
                &Item::Passthrough { src, device } => {
                    let entry = passthrough(m, src, device);
                    sink(&m.tensors[src].name, m.data(src), entry)?;
                    m.release(src);
                    i += 1;
                }
                Item::Slice(sl) => {
                    let bytes = tp::slice_tensor(m, sl.src, &sl.plan)?;
                    sink(&sl.entry.name, &bytes, sl.entry.clone())?;
                    i += 1;
                }
                Item::Blob(b) => {
                    let (layer, rank) = (b.layer, b.rank);
                    let blobs = self.layer_blobs(layer, rank)?;
                    for (name, bytes, entry) in blobs {
                        match &self.items[i] {
                            Item::Blob(b)
                                if b.layer == layer
                                    && b.rank == rank
                                    && name
                                        == blob_name_tp(layer, b.proj, b.layout, b.part, rank) => {}
                            _ => unreachable!("producer order differs from plan at {name}"),
                        }
                        sink(&name, &bytes, entry)?;
                        i += 1;
                    }
                    let l = self.layer(layer);
                    for t in [&l.gate, &l.up, &l.down].into_iter().flat_map(companions) {
                        m.release(t);
                    }
                }
            }
        }
        Ok(())
    }

    /// The FFN layer with index `layer` (every planned layer is one of the model's).
    fn layer(&self, layer: usize) -> &'m FfnLayer {
        &self.model.ffn_layers[self.layer_pos[&layer]]
    }

    /// Every blob of one layer, in plan order: each layout of the registry encodes each of its
    /// projections from one shared context (decoded weights and the NVFP4 base computed once).
    fn layer_blobs(
        &self,
        layer: usize,
        rank: Option<u32>,
    ) -> Result<Vec<(crate::Name, Vec<u8>, TensorEntry)>> {
        let m = self.model;
        let l = self.layer(layer);
        let mut cx = crate::layout::EncodeCx::new(m, l, &self.opts, self.lora.as_ref());
        cx.tp = rank.map(|r| self.inter_ranges[r as usize]);
        let mut out = Vec::new();
        // Each encoding's place in `out` (its parts, in order), to measure its fidelity after
        // the loop (in parallel) from the bytes already there.
        let mut measure = Vec::new();
        for &layout in &self.layouts {
            let spec = layout.spec();
            for &proj in spec.projections() {
                let Some(enc) = spec.encode(&mut cx, proj)? else {
                    continue;
                };
                let pi = crate::layout::source_index(proj);
                let w = cx.weight(pi);
                let [n, k] = cx.shape(pi)?.map(|d| d as u64);
                let shape = if proj == Proj::GateUp {
                    [2 * n, k]
                } else {
                    [n, k]
                };
                if layout != Layout::Lora {
                    let parts = out.len()..out.len() + enc.parts.len();
                    measure.push((layout, proj, [n as usize, k as usize], parts));
                }
                let names = spec.parts(proj, self.opts.q4k_down);
                assert_eq!(
                    enc.parts.iter().map(|p| p.0).collect::<Vec<_>>(),
                    names,
                    "{layout:?} {proj:?} parts"
                );
                let scales = names
                    .contains(&"scales")
                    .then(|| blob_name_tp(layer, proj, layout, "scales", rank));
                let tp = rank.map(|r| TpSlice {
                    rank: r,
                    rule: if pi == 2 {
                        Rule::FfnCols
                    } else {
                        Rule::FfnRows
                    }
                    .name()
                    .into(),
                    source: m.tensors[w.main()].name.to_string(),
                    range: self.inter_ranges[r as usize],
                    pad: cx.pad(),
                });
                for (part, bytes) in enc.parts {
                    let entry = TensorEntry {
                        name: blob_name_tp(layer, proj, layout, part, rank).into(),
                        tp: tp.clone().map(Box::new),
                        device: true,
                        ffn: Some(Box::new(FfnEntry {
                            layer,
                            proj: proj.name().into(),
                            layout: layout.tag().into(),
                            part: part.into(),
                            source_scheme: w.scheme().into(),
                            shape,
                            padded: enc.padded.map(|d| d as u64),
                            scales: scales.clone().filter(|s| !s.ends_with(&format!(".{part}"))),
                            scalars: enc
                                .scalars
                                .iter()
                                .map(|(k, v)| (k.to_string(), *v))
                                .collect(),
                        })),
                        source_type: m.tensors[w.main()].dtype.name(),
                        source_shape: None,
                        bytes: bytes.len() as u64,
                        xxh3: 0,
                    };
                    out.push((entry.name.clone(), bytes, entry));
                }
            }
        }
        if !measure.is_empty() {
            use rayon::prelude::*;
            let (g, u, d) = (cx.dense(0)?, cx.dense(1)?, cx.dense(2)?);
            let src = [g.as_slice(), u.as_slice(), d.as_slice()];
            let file = self.model.path.display().to_string();
            let rels: Vec<f64> = measure
                .par_iter()
                .map(|(layout, proj, nk, parts)| {
                    decoded_rel_err(&file, &src, *layout, *proj, *nk, &out[parts.clone()])
                })
                .collect::<Result<_>>()?;
            let mut f = self.fidelity.lock().unwrap();
            for ((layout, proj, _, _), rel) in measure.iter().zip(rels) {
                let e = f.entry((*layout, *proj)).or_insert((0.0, -1.0, 0, 0));
                e.0 += rel;
                if rel > e.1 {
                    e.1 = rel;
                    e.2 = layer;
                }
                e.3 += 1;
            }
        }
        Ok(out)
    }

    /// The fidelity measured while producing, per layout and projection, in layout order.
    pub fn fidelity(&self) -> Vec<Fidelity> {
        self.fidelity
            .lock()
            .unwrap()
            .iter()
            .map(|(&(layout, proj), &(sum, worst, at, count))| Fidelity {
                layout: layout.tag().into(),
                proj: proj.name().into(),
                worst_rel_err: worst.max(0.0),
                worst_layer: at,
                mean_rel_err: sum / count.max(1) as f64,
            })
            .collect()
    }

    /// The dry run's figures ([`super::choice::dry_run`]): each layout's blob bytes over the
    /// whole pack, from the first planned layer (and rank) encoded and scaled by the blobs
    /// planned, and the bytes carried unchanged. The sampled layer's fidelity is recorded as
    /// convert records it.
    pub(super) fn sample_costs(&self) -> Result<(Vec<(Layout, u64)>, u64)> {
        let carried = self
            .items
            .iter()
            .map(|it| match it {
                &Item::Passthrough { src, .. } => self.model.tensors[src].bytes,
                Item::Slice(sl) => sl.entry.bytes,
                Item::Blob(_) => 0,
            })
            .sum();
        let Some(first) = self.items.iter().find_map(|it| match it {
            Item::Blob(b) => Some(b),
            _ => None,
        }) else {
            return Ok((Vec::new(), carried));
        };
        let sample = self.layer_blobs(first.layer, first.rank)?;
        let costs = self
            .layouts
            .iter()
            .map(|&layout| {
                let of = |e: &TensorEntry| e.ffn.as_ref().is_some_and(|f| f.layout == layout.tag());
                let (n, bytes) = sample
                    .iter()
                    .filter(|(_, _, e)| of(e))
                    .fold((0u64, 0u64), |(n, b), (_, _, e)| (n + 1, b + e.bytes));
                let planned = self
                    .items
                    .iter()
                    .filter(|it| matches!(it, Item::Blob(b) if b.layout == layout))
                    .count() as u64;
                (layout, bytes * planned / n.max(1))
            })
            .collect();
        Ok((costs, carried))
    }

    /// The rank count (1: not tensor-parallel) and the head counts attention was split by.
    pub(super) fn tp(&self) -> (u32, Option<(u64, u64)>) {
        (self.tp, self.heads)
    }

    pub(super) fn manifest(
        &self,
        tensors: Vec<TensorEntry>,
        segment: (u64, u64),
        tp: Option<TpInfo>,
    ) -> Manifest {
        let m = self.model;
        Manifest {
            pack_format_version: PACK_FORMAT_VERSION,
            converter_version: CONVERTER_VERSION.into(),
            target_arch: TARGET_ARCH.into(),
            kernel_abi: KERNEL_ABI_VERSION,
            sources: Vec::new(),
            source_format: m.format.name().into(),
            options: self.opts.clone(),
            layouts: self.layouts.iter().map(|l| l.tag().to_string()).collect(),
            model: ModelInfo {
                architecture: m.architecture.clone(),
                hidden_size: self.hidden,
                intermediate_size: self.inter,
                activation: self.activation.name().into(),
                ffn_layers: m.ffn_layers.len(),
                dense_layers: {
                    let idx: Vec<usize> = m.ffn_layers.iter().map(|l| l.index).collect();
                    if idx.iter().copied().eq(0..idx.len()) {
                        Vec::new()
                    } else {
                        idx
                    }
                },
                moe_layers: m.moe_layers.clone(),
            },
            segment_offset: segment.0,
            segment_bytes: segment.1,
            tensors,
            fidelity: self.fidelity(),
            tp,
        }
    }

    /// Source tensors consumed by the FFN layouts (not carried).
    pub fn ffn_sources(&self) -> &HashSet<usize> {
        &self.ffn_sources
    }
}

pub(super) fn companions(w: &FfnWeight) -> Vec<usize> {
    w.tensors()
}

/// `||decode(enc) - source|| / ||source||` in float64 over the logical shape (the source of the
/// fused gate+up is gate above up); `||decode(enc) - source||` for an all-zero source. `src` holds
/// the gate, up and down source weights decoded to f32.
fn decoded_rel_err(
    file: &str,
    src: &[&[f32]; 3],
    layout: Layout,
    proj: Proj,
    [n, k]: [usize; 2],
    parts: &[(crate::Name, Vec<u8>, TensorEntry)],
) -> Result<f64> {
    let gate_up;
    let source: &[f32] = match proj {
        Proj::GateUp => {
            gate_up = [src[0], src[1]].concat();
            &gate_up
        }
        p => src[crate::layout::source_index(p)],
    };
    let shape = if proj == Proj::GateUp {
        [2 * n, k]
    } else {
        [n, k]
    };
    // Every part of one encoding carries the same padded shape and scalars.
    let fe = parts
        .first()
        .and_then(|(_, _, e)| e.ffn.as_ref())
        .expect("an encoding has at least one part");
    let part = |p: &str| {
        parts
            .iter()
            .find(|(_, _, e)| e.ffn.as_ref().is_some_and(|f| f.part == p))
            .map(|(_, b, _)| &b[..])
    };
    let dec = layout.spec().decode(&crate::layout::BlobRead {
        proj,
        shape,
        padded: fe.padded.map(|d| d as usize),
        scalars: &fe.scalars,
        file,
        name: layout.tag(),
        parts: &part,
    })?;
    // Non-finite source values (carried only with --allow-nonfinite) are left out of the
    // figure; a finite value the layout cannot hold is an error, never a NaN in the manifest.
    let (mut num, mut den) = (0f64, 0f64);
    for (i, (d, s)) in dec.iter().zip(source).enumerate() {
        if !s.is_finite() {
            continue;
        }
        if !d.is_finite() {
            return Err(Error::Output {
                file: file.into(),
                reason: format!(
                    "layout {} cannot hold the {} weight at row {}, column {} ({s}: decodes to {d})",
                    layout.tag(),
                    proj.name(),
                    i / k.max(1),
                    i % k.max(1)
                ),
            });
        }
        let (d, s) = (*d as f64, *s as f64);
        num += (d - s) * (d - s);
        den += s * s;
    }
    Ok(if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    })
}
