//! `shardfuzz gen --count N --seed S --out DIR`: random valid cases.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use shardfuzz_fuzz::generate::random_case;

#[derive(clap::Args)]
pub struct GenArgs {
    #[arg(long, default_value_t = 10)]
    count: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    out: PathBuf,
}

pub fn run(a: GenArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("--out {}", a.out.display()))?;
    for i in 0..a.count {
        let case = random_case(a.seed.wrapping_add(i));
        let path = a.out.join(format!("case-{:06}.json", i));
        std::fs::write(&path, case.to_json()).with_context(|| format!("{}", path.display()))?;
    }
    eprintln!("wrote {} cases to {}", a.count, a.out.display());
    Ok(ExitCode::SUCCESS)
}
