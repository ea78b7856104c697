//! Writes the seed inputs of every fuzz target (`xccl::fuzzing::seeds`) into
//! `<dir>/<target>/seed-<n>`: `cargo run --manifest-path fuzz/Cargo.toml --example seeds -- DIR`.

fn main() -> std::io::Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "fuzz/seeds".into());
    for (name, _) in xccl::fuzzing::TARGETS {
        let d = std::path::Path::new(&dir).join(name);
        std::fs::create_dir_all(&d)?;
        let seeds = xccl::fuzzing::seeds(name);
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i}")), s)?;
        }
        println!("{name}: {} seeds", seeds.len());
    }
    Ok(())
}
