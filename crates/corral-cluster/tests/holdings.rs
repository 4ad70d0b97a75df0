//! Agents' assertions of what they hold (`holdings/<node>`) in the operator's view: held space is occupied whatever the grants say.

use crate::common;

use common::{ViewFixture, held};
use corral_cluster::{
    ClusterConfig, Family, GrantRecord, IpNet, NodeName, OwnedRecord, PoolName, encode_value,
};

const CONFIG: &str = include_str!("configs/holdings.toml");

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn pool(name: &str) -> PoolName {
    PoolName::new(name).unwrap()
}

/// A bare view under `config`.
fn fixture(config: &str) -> ViewFixture {
    ViewFixture::new(ClusterConfig::from_toml(config).unwrap())
}

impl ViewFixture {
    fn register(&mut self, name: &str) -> NodeName {
        self.register_node(NodeName::new(name).unwrap(), format!("uid-{name}"))
    }

    /// Proposes for `node` and commits it as the leader would (its puts, seen back).
    fn grant(&mut self, node: &NodeName) -> Vec<IpNet> {
        let proposal = self.commit_proposal(node);
        proposal.cidrs.iter().map(|c| c.cidr).collect()
    }

    fn assert_holds(&mut self, node: &NodeName, ranges: &[(&str, &str)], node_id: Option<u32>) {
        let ranges = ranges
            .iter()
            .map(|(pool_name, cidr)| held(pool(pool_name), net(cidr)))
            .collect();
        self.hold(node, format!("uid-{node}"), ranges, node_id);
    }

    fn lowest_free(&self) -> Option<IpNet> {
        self.view
            .space(&pool("default"), Family::V4)
            .unwrap()
            .lowest_free()
    }
}

#[test]
fn a_holding_its_grant_covers_changes_nothing() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    let granted = f.grant(&a);
    assert_eq!(granted, vec![net("10.0.0.0/30")]);
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], Some(1));
    assert!(f.view.uncovered_holdings().is_empty());
    assert!(f.view.uncovered_node_ids().is_empty());
    assert_eq!(f.lowest_free(), Some(net("10.0.0.4/30")));
}

/// The defect of issue 20 (1 and 3): the grant is gone from etcd (a node removed while alive,
/// a restored snapshot) while its agent still serves pods from it; the range must not go to
/// the next node.
#[test]
fn a_range_still_held_after_its_grant_is_gone_is_never_proposed() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.grant(&a);
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], Some(1));
    // etcd forgets the grant and the node ID (deleted around the leader).
    f.delete(
        &f.keys
            .grant(&pool("default"), Family::V4, &net("10.0.0.0/30")),
    );
    f.delete(
        &f.keys
            .owned(&a, &pool("default"), Family::V4, &net("10.0.0.0/30")),
    );
    f.delete(&f.keys.node_id(1));
    f.delete(&f.keys.node_id_of_node(&a));
    assert_eq!(
        f.view.uncovered_holdings(),
        vec![(a.clone(), pool("default"), net("10.0.0.0/30"))]
    );
    assert_eq!(f.view.uncovered_node_ids(), vec![(a.clone(), 1)]);
    let b = f.register("b");
    let proposal = f.view.propose(&b).unwrap();
    assert_eq!(proposal.cidrs[0].cidr, net("10.0.0.4/30"));
    assert_eq!(proposal.node_id, Some(2));
    f.view.abandon(&proposal);
    // The holder gives it up: the space is free again.
    f.assert_holds(&a, &[], None);
    assert!(f.view.uncovered_holdings().is_empty());
    assert_eq!(f.lowest_free(), Some(net("10.0.0.0/30")));
    let proposal = f.view.propose(&b).unwrap();
    assert_eq!(proposal.node_id, Some(1));
}

/// Issue 20 (2): a pool renamed around the CLI; the old pool's grants are no longer counted in
/// any space, but the agent's holding blocks the same addresses in the new pool.
#[test]
fn a_held_range_blocks_every_pool_of_its_family() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.assert_holds(&a, &[("old-name", "10.0.0.0/30")], None);
    assert_eq!(f.lowest_free(), Some(net("10.0.0.4/30")));
    assert_eq!(f.view.uncovered_holdings().len(), 1);
}

#[test]
fn holdings_survive_a_configuration_change_and_their_deletion_frees_the_space() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.assert_holds(&a, &[("default", "10.0.0.8/30")], None);
    let wider = CONFIG.replace("10.0.0.0/28", "10.0.0.0/27");
    f.put(
        &f.keys.config(),
        ClusterConfig::from_toml(&wider)
            .unwrap()
            .to_json()
            .unwrap()
            .as_bytes(),
    );
    let space = f.view.space(&pool("default"), Family::V4).unwrap();
    assert!(!space.is_free(&net("10.0.0.8/30")));
    f.delete(&f.keys.holdings(&a));
    let space = f.view.space(&pool("default"), Family::V4).unwrap();
    assert!(space.is_free(&net("10.0.0.8/30")));
}

#[test]
fn a_holding_that_does_not_decode_is_reported_and_the_last_one_stays() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], None);
    f.view.take_problems();
    f.put(&f.keys.holdings(&a), b"not json");
    assert_eq!(f.view.problems().len(), 1);
    assert_eq!(f.lowest_free(), Some(net("10.0.0.4/30")));
}

/// A grant of the held range to another node (a conflict etcd cannot see) leaves the range
/// blocked for everyone else and reported as uncovered for its holder.
#[test]
fn a_range_held_by_one_node_and_granted_to_another_stays_reported() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], None);
    let b = f.register("b");
    // Written around arbitration (as a restored snapshot would hold it).
    let grant = GrantRecord {
        node: b.clone(),
        uid: "uid-b".into(),
        node_revision: 3,
        granted_ms: None,
    };
    f.put(
        &f.keys
            .grant(&pool("default"), Family::V4, &net("10.0.0.0/30")),
        &encode_value(&grant).unwrap(),
    );
    f.put(
        &f.keys
            .owned(&b, &pool("default"), Family::V4, &net("10.0.0.0/30")),
        &encode_value(&OwnedRecord { node_revision: 3 }).unwrap(),
    );
    assert_eq!(
        f.view.uncovered_holdings(),
        vec![(a.clone(), pool("default"), net("10.0.0.0/30"))]
    );
    // Deleting the conflicting grant leaves the holder's range occupied.
    f.delete(
        &f.keys
            .grant(&pool("default"), Family::V4, &net("10.0.0.0/30")),
    );
    assert_eq!(f.lowest_free(), Some(net("10.0.0.4/30")));
}

/// Review (2026-12-01): the agent serves the ID named by `nodeids/node/<node>`, but only
/// `nodeids/id/<id>` occupies it. With the latter deleted by hand, the node index still named
/// the ID, so the holding was taken as covered and the next node was proposed the same ID.
#[test]
fn a_node_id_whose_id_key_was_deleted_by_hand_stays_held() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.grant(&a);
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], Some(1));
    f.delete(&f.keys.node_id(1));
    assert_eq!(f.view.node_id_of(&a), Some(1), "the index still names it");
    assert_eq!(f.view.uncovered_node_ids(), vec![(a.clone(), 1)]);
    let index = f.keys.node_id_of_node(&a);
    assert!(
        f.view
            .consistency_problems()
            .iter()
            .any(|p| p.key == index && p.message.contains("does not name a")),
        "{:?}",
        f.view.consistency_problems()
    );
    let b = f.register("b");
    let proposal = f.view.propose(&b).unwrap();
    assert_eq!(proposal.node_id, Some(2));
    f.view.abandon(&proposal);
    // Its ID key back (a leader's repair, or the hand undoing it): covered again.
    f.put(
        &f.keys.node_id(1),
        &encode_value(&corral_cluster::NodeIdRecord {
            node: a.clone(),
            uid: format!("uid-{a}"),
            node_revision: 0,
        })
        .unwrap(),
    );
    assert!(f.view.uncovered_node_ids().is_empty());
}

/// Review (2026-12-01): a node whose ID changed (a restore lost its grant, or it was removed
/// and registered again) still serves pods from the old ID's pod range while it drains. Its
/// record named only the highest ID, so an older one was taken as given up and proposed to the
/// next node while pods still used its addresses.
#[test]
fn every_node_id_a_node_serves_is_held_not_only_the_highest() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    f.grant(&a);
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], Some(1));
    // A restore forgets the ID; the leader grants `a` another around the one it holds.
    f.delete(&f.keys.node_id(1));
    f.delete(&f.keys.node_id_of_node(&a));
    let proposal = f.commit_proposal(&a);
    assert_eq!(proposal.node_id, Some(2));
    // The agent serves ID 2 and drains ID 1's pod range.
    let record = corral_cluster::HoldingsRecord {
        uid: format!("uid-{a}"),
        ranges: vec![held(pool("default"), net("10.0.0.0/30"))],
        node_id: Some(2),
        other_node_ids: vec![1],
        ..Default::default()
    };
    f.put(&f.keys.holdings(&a), &encode_value(&record).unwrap());
    assert_eq!(f.view.uncovered_node_ids(), vec![(a.clone(), 1)]);
    let b = f.register("b");
    let proposal = f.view.propose(&b).unwrap();
    assert_eq!(proposal.node_id, Some(3));
    f.view.abandon(&proposal);
    // Drained: ID 1 is free again.
    f.assert_holds(&a, &[("default", "10.0.0.0/30")], Some(2));
    assert!(f.view.uncovered_node_ids().is_empty());
    assert_eq!(f.view.propose(&b).unwrap().node_id, Some(1));
}

/// Review (2026-12-01): the agent takes up an `owned/` key newer than anything it saw, grant or
/// not. One written by hand without its grant (or whose grant was deleted by hand) occupied
/// nothing, so the leader could grant the same range to another node before the agent's
/// holdings record said it served it.
#[test]
fn an_owned_key_without_its_grant_blocks_its_range_until_it_goes() {
    let mut f = fixture(CONFIG);
    let a = f.register("a");
    let owned = f
        .keys
        .owned(&a, &pool("default"), Family::V4, &net("10.0.0.0/30"));
    f.put(
        &owned,
        &encode_value(&OwnedRecord { node_revision: 1 }).unwrap(),
    );
    assert_eq!(f.lowest_free(), Some(net("10.0.0.4/30")));
    // Its grant is deleted by hand while the key stays: still blocked.
    let b = f.register("b");
    let granted = f.grant(&b);
    assert_eq!(granted, vec![net("10.0.0.4/30")]);
    f.put(
        &f.keys
            .grant(&pool("default"), Family::V4, &net("10.0.0.8/30")),
        &encode_value(&GrantRecord {
            node: a.clone(),
            uid: format!("uid-{a}"),
            node_revision: 1,
            granted_ms: None,
        })
        .unwrap(),
    );
    let second = f
        .keys
        .owned(&a, &pool("default"), Family::V4, &net("10.0.0.8/30"));
    f.put(
        &second,
        &encode_value(&OwnedRecord { node_revision: 1 }).unwrap(),
    );
    f.delete(
        &f.keys
            .grant(&pool("default"), Family::V4, &net("10.0.0.8/30")),
    );
    assert_eq!(f.lowest_free(), Some(net("10.0.0.12/30")));
    // The keys go: the ranges are free again.
    f.delete(&owned);
    f.delete(&second);
    assert_eq!(f.lowest_free(), Some(net("10.0.0.0/30")));
    // A value that does not decode blocks all the same (the agent does not read it).
    f.put(&owned, b"not json");
    assert_eq!(f.lowest_free(), Some(net("10.0.0.8/30")));
    f.delete(&owned);
    assert_eq!(f.lowest_free(), Some(net("10.0.0.0/30")));
}
