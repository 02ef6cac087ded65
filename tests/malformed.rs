//! Hostile and broken inputs: every one is a clear error naming the file, tensor and field; no
//! panic; no allocation larger than a small multiple of the input's size.

use metrale_pack::gguf::{self, Value, ValueType};
use metrale_pack::gguf_write::build;
use metrale_pack::model::Model;
use metrale_pack::{Error, GgmlType};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Tracks the largest single allocation made by the current thread.
struct Tracking;
thread_local! { static LARGEST: Cell<usize> = const { Cell::new(0) }; }
// SAFETY: forwards to the system allocator unchanged; only records sizes in a const-initialised
// thread-local Cell, which never allocates.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.with(|m| m.set(m.get().max(l.size())));
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: p was allocated by System with layout l.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LARGEST.with(|m| m.set(m.get().max(n)));
        // SAFETY: p was allocated by System with layout l.
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Tracking = Tracking;

fn valid() -> Vec<u8> {
    build(
        32,
        &[
            ("general.architecture", Value::String("llama".into())),
            ("llama.embedding_length", Value::U32(64)),
            (
                "tok.list",
                Value::Array(
                    ValueType::String,
                    vec![Value::String("a".into()), Value::String("bc".into())],
                ),
            ),
            ("flag", Value::Bool(true)),
        ],
        &[
            (
                "blk.0.ffn_gate.weight",
                vec![64, 2],
                GgmlType::Q8_0,
                vec![0x11; 136],
            ),
            (
                "blk.0.ffn_up.weight",
                vec![64, 2],
                GgmlType::F16,
                vec![0x22; 256],
            ),
            (
                "blk.0.ffn_down.weight",
                vec![2, 64],
                GgmlType::F32,
                vec![0x33; 512],
            ),
        ],
    )
}

/// Parse with the allocation tracker armed; the largest allocation must stay under 64x the input.
fn parse_checked(img: &[u8]) -> Result<gguf::Parsed, Error> {
    LARGEST.with(|m| m.set(0));
    let r = gguf::parse(img, "evil.gguf");
    let largest = LARGEST.with(|m| m.get());
    assert!(
        largest <= 64 * img.len() + 4096,
        "largest allocation {largest} B for a {} B input",
        img.len()
    );
    r
}

fn pos(img: &[u8], needle: &[u8]) -> usize {
    img.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle")
}

/// Byte position just after tensor `name`'s name string.
fn after_name(img: &[u8], name: &str) -> usize {
    pos(img, name.as_bytes()) + name.len()
}

fn expect_err(img: &[u8], want: &[&str]) -> String {
    let e = parse_checked(img)
        .err()
        .unwrap_or_else(|| panic!("accepted a bad file; wanted {want:?}"));
    let msg = e.to_string();
    assert!(msg.starts_with("evil.gguf: "), "{msg}");
    for w in want {
        assert!(msg.contains(w), "message {msg:?} lacks {w:?}");
    }
    msg
}

#[test]
fn valid_file_parses() {
    let p = parse_checked(&valid()).unwrap();
    assert_eq!(p.tensors.len(), 3);
    assert_eq!(p.tensors[2].shape(), vec![64, 2]);
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let img = valid();
    for cut in 0..img.len() {
        let e = parse_checked(&img[..cut]);
        assert!(e.is_err(), "prefix of {cut} bytes accepted");
        let msg = e.err().unwrap().to_string();
        assert!(msg.contains("evil.gguf"), "{msg}");
    }
}

#[test]
fn header_fields() {
    let mut img = valid();
    img[0] = b'X';
    expect_err(&img, &["not a GGUF file"]);
    let mut img = valid();
    img[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect_err(&img, &["version 1"]);
    let mut img = valid();
    img[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_err(&img, &["big-endian"]);
    let mut img = valid();
    img[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_err(&img, &["tensor_count", "18446744073709551615"]);
    let mut img = valid();
    img[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    expect_err(&img, &["kv_count"]);
}

#[test]
fn metadata_fields() {
    // Absurd key length.
    let mut img = valid();
    img[24..32].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    expect_err(&img, &["kv[0].key", "count"]);
    // Absurd array count.
    let mut img = valid();
    let p = after_name(&img, "tok.list") + 4 + 4; // value type (9), element type (8)
    img[p..p + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    expect_err(&img, &["tok.list", "count 4611686018427387904"]);
    // Absurd string length inside the array.
    let mut img = valid();
    img[p + 8..p + 16].copy_from_slice(&(1u64 << 50).to_le_bytes());
    expect_err(&img, &["tok.list"]);
    // Unknown value type.
    let mut img = valid();
    let q = after_name(&img, "flag");
    img[q..q + 4].copy_from_slice(&13u32.to_le_bytes());
    expect_err(&img, &["flag", "unknown metadata value type 13"]);
    // Bool that is neither 0 nor 1.
    let mut img = valid();
    img[q + 4] = 2;
    expect_err(&img, &["flag", "bool byte 2"]);
    // Invalid UTF-8 in a key.
    let mut img = valid();
    let k = pos(&img, b"flag");
    img[k] = 0xFF;
    expect_err(&img, &["not valid UTF-8"]);
    // Duplicate key.
    let img = build(32, &[("a", Value::U8(1)), ("a", Value::U8(2))], &[]);
    expect_err(&img, &["metadata key a appears twice"]);
    // Arrays nested five deep.
    let mut v = Value::Array(ValueType::U8, vec![Value::U8(1)]);
    for _ in 0..5 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let img = build(32, &[("deep", v)], &[]);
    expect_err(&img, &["deep", "nested deeper than 4"]);
    // Alignment: not a power of two; wrong type.
    let img = build(32, &[("general.alignment", Value::U32(48))], &[]);
    expect_err(&img, &["general.alignment", "power of two"]);
    let img = build(32, &[("general.alignment", Value::U64(64))], &[]);
    expect_err(&img, &["general.alignment", "u32"]);
}

#[test]
fn tensor_fields() {
    let name = "blk.0.ffn_up.weight";
    let at = |img: &[u8]| after_name(img, name);
    // n_dims > 4.
    let mut img = valid();
    let p = at(&img);
    img[p..p + 4].copy_from_slice(&5u32.to_le_bytes());
    expect_err(&img, &[name, "n_dims", "5 > 4"]);
    // ne overflow: 2^40 * 2^40.
    let mut img = valid();
    img[p + 4..p + 12].copy_from_slice(&(1u64 << 40).to_le_bytes());
    img[p + 12..p + 20].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_err(&img, &[name, "ne", "overflows"]);
    // Negative ne as int64.
    let mut img = valid();
    img[p + 4..p + 12].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_err(&img, &[name, "negative"]);
    // Unknown type id.
    let mut img = valid();
    img[p + 20..p + 24].copy_from_slice(&99u32.to_le_bytes());
    expect_err(&img, &[name, "type", "unknown ggml type id 99"]);
    // A removed type id (Q4_0_4_4 = 31).
    img[p + 20..p + 24].copy_from_slice(&31u32.to_le_bytes());
    expect_err(&img, &[name, "unknown ggml type id 31"]);
    // ne[0] not a whole number of Q8_0 blocks.
    img[p + 20..p + 24].copy_from_slice(&(GgmlType::Q8_0 as u32).to_le_bytes());
    img[p + 4..p + 12].copy_from_slice(&33u64.to_le_bytes());
    expect_err(&img, &[name, "ne[0] = 33", "Q8_0"]);
    // Misaligned offset.
    let mut img = valid();
    let off = u64::from_le_bytes(img[p + 24..p + 32].try_into().unwrap());
    img[p + 24..p + 32].copy_from_slice(&(off + 4).to_le_bytes());
    expect_err(&img, &[name, "offset", "multiple of general.alignment 32"]);
    // Past the end of the file.
    img[p + 24..p + 32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_err(&img, &[name, "offset", "past the end"]);
    // Offset overflow.
    img[p + 24..p + 32].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    expect_err(&img, &[name, "offset"]);
    // Overlap with the gate tensor (offset 0).
    img[p + 24..p + 32].copy_from_slice(&0u64.to_le_bytes());
    expect_err(&img, &["overlap", "blk.0.ffn_gate.weight", name]);
    // Duplicate name.
    let img = build(
        32,
        &[],
        &[
            ("t", vec![4], GgmlType::F32, vec![0; 16]),
            ("t", vec![4], GgmlType::F32, vec![0; 16]),
        ],
    );
    expect_err(&img, &["tensor name t appears twice"]);
}

#[test]
fn model_open_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut img = valid();
    img.truncate(img.len() - 100);
    let p = dir.path().join("cut.gguf");
    std::fs::write(&p, &img).unwrap();
    let msg = Model::open(&p).err().unwrap().to_string();
    assert!(
        msg.contains("cut.gguf")
            && msg.contains("blk.0.ffn_down.weight")
            && msg.contains("past the end"),
        "{msg}"
    );
    let p2 = dir.path().join("notes.txt");
    std::fs::write(&p2, b"hello").unwrap();
    let msg = Model::open(&p2).err().unwrap().to_string();
    assert!(
        msg.contains("notes.txt") && msg.contains("not a GGUF file"),
        "{msg}"
    );
}

fn st_header(json: &str, data: usize) -> Vec<u8> {
    let mut v = (json.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(json.as_bytes());
    v.extend(std::iter::repeat_n(0u8, data));
    v
}

#[test]
fn bad_safetensors_headers() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "huge.safetensors",
            u64::MAX.to_le_bytes().to_vec(),
            "safetensors",
        ),
        ("short.safetensors", vec![1, 2, 3], "safetensors"),
        ("json.safetensors", st_header("{not json", 0), "safetensors"),
        (
            "offsets.safetensors",
            st_header(
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                4,
            ),
            "safetensors",
        ),
        (
            "trailing.safetensors",
            st_header(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                8,
            ),
            "safetensors",
        ),
        (
            "dtype.safetensors",
            st_header(
                r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}"#,
                4,
            ),
            "safetensors",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, &bytes).unwrap();
        LARGEST.with(|m| m.set(0));
        let msg = Model::open(&p)
            .err()
            .unwrap_or_else(|| panic!("{name} accepted"))
            .to_string();
        assert!(
            LARGEST.with(|m| m.get()) < 1 << 20,
            "{name}: large allocation"
        );
        assert!(msg.contains(name) && msg.contains(want), "{name}: {msg}");
    }
}

#[test]
fn quantized_companions_with_wrong_shapes_are_refused_by_name() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = tempfile::tempdir().unwrap();
    let codes = vec![0u8; 4 * 16];
    let scales = vec![0x38u8; 4]; // should be [4, 2] for k = 32
    let s2 = 1.0f32.to_le_bytes();
    let tensors = vec![
        (
            "model.layers.0.mlp.gate_proj.weight",
            TensorView::new(Dtype::U8, vec![4, 16], &codes).unwrap(),
        ),
        (
            "model.layers.0.mlp.gate_proj.weight_scale",
            TensorView::new(Dtype::F8_E4M3, vec![4, 1], &scales).unwrap(),
        ),
        (
            "model.layers.0.mlp.gate_proj.weight_scale_2",
            TensorView::new(Dtype::F32, vec![], &s2).unwrap(),
        ),
    ];
    let p = dir.path().join("model.safetensors");
    safetensors::serialize_to_file(tensors, None, &p).unwrap();
    let m = Model::open(&p).unwrap();
    let i = m.tensor("model.layers.0.mlp.gate_proj.weight").unwrap();
    let w = metrale_pack::model::FfnWeight::ModelOptNvfp4 {
        weight: i,
        scale: m
            .tensor("model.layers.0.mlp.gate_proj.weight_scale")
            .unwrap(),
        scale_2: m
            .tensor("model.layers.0.mlp.gate_proj.weight_scale_2")
            .unwrap(),
        input_scale: None,
    };
    let msg = m.decode_weight(&w).err().unwrap().to_string();
    assert!(
        msg.contains("model.layers.0.mlp.gate_proj.weight_scale") && msg.contains("[4, 2]"),
        "{msg}"
    );
}

/// A hostile manifest (header checksum recomputed, so only the manifest checks stand in the way):
/// shapes, padded shapes, offsets, counts and scalars that overflow or disagree with the blobs
/// are refused on open, naming the pack, the tensor and the field; never a panic, never a large
/// allocation.
#[test]
fn hostile_manifests_are_refused_naming_pack_tensor_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    metrale_pack::testing::gen_model::gen_model(&src, 64, 128, 1, GgmlType::F16, "llama").unwrap();
    let pack = dir.path().join("m.mpk.gguf");
    let opts = metrale_pack::pack::ConvertOptions {
        layouts: Some(vec![
            metrale_pack::layout::Layout::Nvfp4,
            metrale_pack::layout::Layout::Fp8,
            metrale_pack::layout::Layout::Q4kMmq,
        ]),
        ..Default::default()
    };
    metrale_pack::pack::convert(Model::open(&src).unwrap(), &opts, &pack, &|_, _| {}).unwrap();
    let img = std::fs::read(&pack).unwrap();
    let g = gguf::parse(&img, "m").unwrap();
    let Some(Value::String(json)) = g
        .kvs
        .iter()
        .find(|kv| kv.key == metrale_pack::pack::keys::MANIFEST)
        .map(|kv| kv.value.clone())
    else {
        panic!("no manifest")
    };
    let json = json.trim_end().to_string();
    let big = u64::MAX / 2;
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "overflowing shape",
            json.replacen("\"shape\":[128,64]", &format!("\"shape\":[{big},{big}]"), 1),
            "blk.0.ffn_gate.nvfp4.codes",
            "ffn.shape",
        ),
        (
            "overflowing padded shape",
            json.replacen("\"padded\":[128,64]", &format!("\"padded\":[{big},64]"), 1),
            "blk.0.ffn_gate.nvfp4.codes",
            "ffn.padded",
        ),
        (
            "a layer past the count",
            json.replacen("\"layer\":0", "\"layer\":4294967296", 1),
            "blk.0.ffn_gate.nvfp4.codes",
            "ffn.layer",
        ),
        (
            "a byte count that disagrees with the blob",
            json.replacen("\"bytes\":4096", "\"bytes\":18446744073709551615", 1),
            "blk.0.ffn_gate.nvfp4.codes",
            "18446744073709551615 bytes",
        ),
        (
            "a global scale that is not finite",
            {
                let at = json.find("\"global_scale\":").unwrap() + "\"global_scale\":".len();
                let end = at + json[at..].find('}').unwrap();
                format!("{}-1e39{}", &json[..at], &json[end..])
            },
            "blk.0.ffn_gate.nvfp4.codes",
            "ffn.scalars",
        ),
        (
            "a device tensor flagged as a host tensor",
            json.replacen(
                "\"name\":\"token_embd.weight\",\"device\":true",
                "\"name\":\"token_embd.weight\",\"device\":false",
                1,
            ),
            "token_embd.weight",
            "device",
        ),
        (
            "an FFN blob flagged as a host tensor",
            json.replacen("},\"device\":true", "},\"device\":false", 1),
            "blk.0.ffn_gate.nvfp4.codes",
            "device",
        ),
    ];
    for (what, hostile, tensor, field) in cases {
        assert_ne!(hostile, json, "{what}: the edit did not apply");
        let edited = metrale_pack::fuzzing::with_manifest(&img, &hostile).unwrap();
        let p = dir.path().join("hostile.mpk.gguf");
        std::fs::write(&p, &edited).unwrap();
        LARGEST.with(|m| m.set(0));
        let e = metrale_pack::pack::Pack::open(&p)
            .err()
            .unwrap_or_else(|| panic!("{what}: opened"))
            .to_string();
        let largest = LARGEST.with(|m| m.get());
        assert!(
            largest < 16 * edited.len(),
            "{what}: allocated {largest} bytes"
        );
        assert!(e.contains("hostile.mpk.gguf"), "{what}: {e}");
        assert!(e.contains(tensor) && e.contains(field), "{what}: {e}");
    }
}
