//! `agent-bridge profiles`: the built-in sandbox profiles, or one as TOML.

use agent_bridge::profile::{BUILT_IN, Profile};

pub fn run(name: Option<String>, json: bool) -> anyhow::Result<()> {
    let Some(name) = name else {
        let all: Vec<Profile> = BUILT_IN
            .iter()
            .map(|(n, t)| Profile::parse(n, t).expect("built-in profiles parse"))
            .collect();
        if json {
            println!("{}", serde_json::to_string_pretty(&all)?);
        } else {
            println!("{:<14} {:<15} DESCRIPTION", "PROFILE", "REPRODUCES");
            for p in all {
                let r = p.reproduces.as_deref().unwrap_or("-");
                println!("{:<14} {:<15} {}", p.name, r, p.description);
            }
        }
        return Ok(());
    };
    let p = Profile::load(&name)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&p)?);
    } else if let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name) {
        print!("{text}");
    } else {
        print!("{}", toml::to_string_pretty(&p)?);
    }
    Ok(())
}
