//! Split GGUF models (`NAME-0000i-of-0000N.gguf` with `split.*` keys) read as one model.

use metrale_pack::GgmlType;
use metrale_pack::gguf::Value;
use metrale_pack::gguf_write::build;
use metrale_pack::model::Model;

fn shard(no: u16, count: u16, total: i32, names: &[&str]) -> Vec<u8> {
    let mut kvs = vec![
        ("split.no", Value::U16(no)),
        ("split.count", Value::U16(count)),
        ("split.tensors.count", Value::I32(total)),
    ];
    if no == 0 {
        kvs.insert(0, ("general.architecture", Value::String("llama".into())));
        kvs.push(("llama.embedding_length", Value::U32(32)));
        kvs.push(("llama.feed_forward_length", Value::U32(64)));
    }
    let ts: Vec<(&str, Vec<u64>, GgmlType, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let ne = if n.contains("down") {
                vec![64, 32]
            } else {
                vec![32, 64]
            };
            (*n, ne, GgmlType::F16, vec![no as u8 + 1; 64 * 32 * 2])
        })
        .collect();
    build(32, &kvs, &ts)
}

#[test]
fn split_model_reads_as_one_from_any_shard() {
    let dir = tempfile::tempdir().unwrap();
    let a = ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"];
    let b = ["blk.0.ffn_down.weight"];
    std::fs::write(dir.path().join("m-00001-of-00002.gguf"), shard(0, 2, 3, &a)).unwrap();
    std::fs::write(dir.path().join("m-00002-of-00002.gguf"), shard(1, 2, 3, &b)).unwrap();
    for start in ["m-00001-of-00002.gguf", "m-00002-of-00002.gguf"] {
        let m = Model::open(dir.path().join(start)).unwrap();
        assert_eq!(m.files.len(), 2);
        assert_eq!(m.tensors.len(), 3);
        assert_eq!(m.ffn_layers.len(), 1);
        assert_eq!(m.architecture.as_deref(), Some("llama"));
        assert_eq!((m.hidden_size, m.intermediate_size), (Some(32), Some(64)));
        let d = m.tensor("blk.0.ffn_down.weight").unwrap();
        assert_eq!(m.tensors[d].file, 1);
        assert!(m.data(d).iter().all(|&x| x == 2));
    }
}

#[test]
fn inconsistent_splits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = ["blk.0.ffn_gate.weight"];
    // Declared 3 tensors, the shards hold 2.
    std::fs::write(dir.path().join("m-00001-of-00002.gguf"), shard(0, 2, 3, &a)).unwrap();
    std::fs::write(
        dir.path().join("m-00002-of-00002.gguf"),
        shard(1, 2, 3, &["blk.0.ffn_up.weight"]),
    )
    .unwrap();
    let msg = Model::open(dir.path().join("m-00001-of-00002.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("split.tensors.count = 3") && msg.contains("2 tensors"),
        "{msg}"
    );
    // Wrong split.no in the second shard.
    std::fs::write(
        dir.path().join("m-00002-of-00002.gguf"),
        shard(0, 2, 2, &["blk.0.ffn_up.weight"]),
    )
    .unwrap();
    let msg = Model::open(dir.path().join("m-00001-of-00002.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("m-00002-of-00002.gguf") && msg.contains("split.no"),
        "{msg}"
    );
    // A missing shard.
    std::fs::remove_file(dir.path().join("m-00002-of-00002.gguf")).unwrap();
    let msg = Model::open(dir.path().join("m-00001-of-00002.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("m-00002-of-00002.gguf"), "{msg}");
    // The same tensor in both shards.
    std::fs::write(dir.path().join("m-00001-of-00002.gguf"), shard(0, 2, 2, &a)).unwrap();
    std::fs::write(dir.path().join("m-00002-of-00002.gguf"), shard(1, 2, 2, &a)).unwrap();
    let msg = Model::open(dir.path().join("m-00001-of-00002.gguf"))
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("appears twice"), "{msg}");
}
