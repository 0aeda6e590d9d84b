//! Version scripts that only declare nodes, for the build scripts of the drop-in libraries
//! (crates/ibverbs and crates/rdmacm include this file): each exported symbol gets
//! its node from a `.symver` directive next to its definition (src/export.rs), because
//! rustc's own anonymous version script for a cdylib would beat named nodes that list
//! symbols (they would stay unversioned).

/// `A { }; B { } A; ...` for each chain (each node inheriting the one before it), then
/// `N { };` for each standalone node.
pub(crate) fn declare(chains: &[&[&str]], standalone: &[&str]) -> String {
    let mut text = String::new();
    for chain in chains {
        let mut prev: Option<&str> = None;
        for node in *chain {
            match prev {
                None => text.push_str(&format!("{node} {{ }};\n")),
                Some(p) => text.push_str(&format!("{node} {{ }} {p};\n")),
            }
            prev = Some(node);
        }
    }
    for node in standalone {
        text.push_str(&format!("{node} {{ }};\n"));
    }
    text
}
