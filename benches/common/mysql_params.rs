//! MySQL statements with leasehold's documented `:name` parameters, run on a raw `mysql`
//! connection the way the registry's connections run them: rewritten once to `?` form, with
//! the parameter each `?` takes. Shared by the benches (through `raw_lease.rs`) and
//! `examples/mysql_cycles.rs`.

/// The documented parameter names of MySQL statements, in order.
pub const NAMES: [&str; 6] = [
    "lock_key",
    "region",
    "client_id",
    "ttl_micros",
    "token",
    "lock_name",
];

/// `sql` with its `:name` parameters turned into `?`, and the parameter (index into
/// [`NAMES`]) each takes.
pub fn question_marks(sql: &str) -> (String, Vec<usize>) {
    let (mut out, mut order, mut quoted) = (String::new(), Vec::new(), false);
    let mut rest = sql;
    while let Some(c) = rest.chars().next() {
        if c == '\'' {
            quoted = !quoted;
        }
        if c == ':' && !quoted {
            let name: String = rest[1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if let Some(index) = NAMES.iter().position(|known| *known == name) {
                out.push('?');
                order.push(index);
                rest = &rest[1 + name.len()..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    (out, order)
}

/// The parameters of a lease statement on the default region, in the order `order` (from
/// [`question_marks`]) takes them.
pub fn values(
    key: &str,
    client: &str,
    ttl: i64,
    token: i64,
    name: &str,
    order: &[usize],
) -> Vec<mysql::Value> {
    let all: [mysql::Value; 6] = [
        key.into(),
        "DEFAULT".into(),
        client.into(),
        ttl.into(),
        token.into(),
        name.into(),
    ];
    order.iter().map(|index| all[*index].clone()).collect()
}
