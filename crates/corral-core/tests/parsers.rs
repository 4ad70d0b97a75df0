//! Hostile text for every parser: arbitrary and near-valid input never panics, and whatever
//! parses reads back as itself.

use corral_core::{
    AttachmentKey, Engine, EngineConfig, Exclusion, PoolName, RangeSpec, parse_addr, parse_net,
};
use proptest::prelude::*;

/// Pieces that make near-valid range specs: real syntax in random order and amounts.
fn range_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("10.0.0.0/24".to_owned()),
        Just("10.0.0.0/0".to_owned()),
        Just("::/0".to_owned()),
        Just("fd00::/64".to_owned()),
        Just("255.255.255.255/32".to_owned()),
        Just(",".to_owned()),
        Just("range=".to_owned()),
        Just("gateway=".to_owned()),
        Just("start=".to_owned()),
        Just("end=".to_owned()),
        Just("-".to_owned()),
        Just("/".to_owned()),
        Just("10.0.0.5".to_owned()),
        Just("fd00::5".to_owned()),
        Just("::".to_owned()),
        (0u32..=40).prop_map(|n| n.to_string()),
        "[ -~]{0,6}",
    ];
    prop::collection::vec(piece, 0..10).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn range_specs_never_panic_and_round_trip(text in prop_oneof![range_text(), "\\PC{0,40}"]) {
        if let Ok(spec) = text.parse::<RangeSpec>() {
            let again: RangeSpec = spec.to_string().parse().expect("canonical text parses");
            prop_assert_eq!(again, spec);
            // Whatever parses can be added to a fresh engine, and counted, without panicking.
            let mut engine = Engine::new(EngineConfig::default());
            let pool = PoolName::default_pool();
            engine.add_range(&pool, spec).expect("a fresh engine takes any valid range");
            let stats = engine.stats(&pool, spec.family()).expect("stats");
            prop_assert_eq!(stats.capacity, spec.size());
            prop_assert_eq!(stats.free, spec.size());
            let _ = engine.status_line();
        }
    }

    #[test]
    fn addresses_networks_and_exclusions_never_panic(text in "\\PC{0,50}", reason in "\\PC{0,20}") {
        let _ = parse_addr(&text);
        let _ = parse_net(&text);
        if let Ok(exclusion) = Exclusion::parse(&text, &reason) {
            let mut engine = Engine::new(EngineConfig::default());
            engine.exclude(&PoolName::default_pool(), exclusion).expect("exclusions fit any pool");
        }
    }

    #[test]
    fn names_and_keys_never_panic(
        network in "\\PC{0,20}",
        container_id in "\\PC{0,20}",
        ifname in "\\PC{0,20}",
    ) {
        let _ = PoolName::new(&network);
        if let Ok(key) = AttachmentKey::new(&network, &container_id, &ifname) {
            // A valid key never names a path.
            for part in [key.network(), key.container_id(), key.ifname()] {
                prop_assert!(!part.contains('/'));
                prop_assert!(part != "." && part != "..");
            }
        }
    }
}
