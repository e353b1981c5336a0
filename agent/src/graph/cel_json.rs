//! A borrowed `serde_json::Value` as a CEL value, converted only where an expression
//! looks: `obj.status.phase` reads two map entries of the object and copies nothing
//! else. Converting a whole Pod into CEL's own map per evaluation cost ~47 µs
//! (release build, 2.5 KB Pod); reading through this view costs a few hundred ns.
//!
//! Objects behave as CEL maps with string keys, arrays as lists: indexing, `.f`,
//! `has()`, `in`, `size()`, `==`, and the macros. Scalars are handed out as CEL's own
//! values, strings borrowed from the JSON.
//!
//! Limits, from how the interpreter treats values that are not its own built-ins
//! (it would convert the value on every field access if this one claimed to be
//! one): a map or list of the object compares equal to a literal only with the
//! object on the left (`obj.spec.finalizers == ['a']`, not `['a'] == …`), and `+` on
//! such a list has no overload.

use std::sync::OnceLock;

use ::cel::ExecutionError;
use ::cel::common::traits::{self, Container, Indexer, Iterable, Sizer, Zeroer};
use ::cel::common::types::{
    self, CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt, Type,
};
use ::cel::common::value::{CowVal, Val};
use serde_json::Value as Json;

/// An object or array of a JSON document, as a CEL map or list.
pub(super) struct JsonVal<'v> {
    json: &'v Json,
    /// Map keys or list elements, built on first iteration.
    items: OnceLock<Vec<Box<dyn Val + 'v>>>,
    /// The full conversion, built for `==`.
    builtin: OnceLock<Converted<'v>>,
}

enum Converted<'v> {
    Map(CelMap<'v>),
    List(CelList<'v>),
}

impl std::fmt::Debug for JsonVal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JsonVal({})", self.json)
    }
}

impl<'v> JsonVal<'v> {
    /// A view of `json`, which must be an object or an array.
    pub(super) fn new(json: &'v Json) -> Self {
        debug_assert!(json.is_object() || json.is_array());
        JsonVal {
            json,
            items: OnceLock::new(),
            builtin: OnceLock::new(),
        }
    }

    fn converted(&self) -> &Converted<'v> {
        self.builtin.get_or_init(|| match self.json {
            Json::Object(o) => Converted::Map(CelMap::from(
                o.iter()
                    .map(|(k, v)| {
                        (
                            CelMapKey::String(CelString::from(k.as_str())),
                            to_builtin(v),
                        )
                    })
                    .collect::<std::collections::HashMap<_, _>>(),
            )),
            _ => Converted::List(CelList::from(
                self.json
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(to_builtin)
                    .collect::<Vec<_>>(),
            )),
        })
    }
}

/// A JSON value as a CEL value: scalars as CEL's own, containers as views.
pub(super) fn to_val<'v>(json: &'v Json) -> Box<dyn Val + 'v> {
    match json {
        Json::Null => Box::new(CelNull),
        Json::Bool(b) => Box::new(CelBool::from(*b)),
        Json::Number(n) => number(n),
        Json::String(s) => Box::new(CelString::from(s.as_str())),
        Json::Object(_) | Json::Array(_) => Box::new(JsonVal::new(json)),
    }
}

/// A JSON value converted whole into CEL's built-in values.
fn to_builtin<'v>(json: &'v Json) -> Box<dyn Val + 'v> {
    match json {
        Json::Object(_) | Json::Array(_) => match JsonVal::new(json).builtin_owned() {
            Converted::Map(m) => Box::new(m),
            Converted::List(l) => Box::new(l),
        },
        _ => to_val(json),
    }
}

impl<'v> JsonVal<'v> {
    fn builtin_owned(self) -> Converted<'v> {
        self.converted();
        self.builtin.into_inner().expect("just built")
    }
}

fn number<'v>(n: &serde_json::Number) -> Box<dyn Val + 'v> {
    if let Some(i) = n.as_i64() {
        Box::new(CelInt::from(i))
    } else if let Some(u) = n.as_u64() {
        Box::new(CelUInt::from(u))
    } else {
        Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
    }
}

impl<'v> Val for JsonVal<'v> {
    fn get_type(&self) -> &Type {
        if self.json.is_object() {
            &types::MAP_TYPE
        } else {
            &types::LIST_TYPE
        }
    }

    fn cel_type() -> &'static Type {
        &types::DYN_TYPE
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self)
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self)
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        match self.converted() {
            Converted::Map(m) => m.equals(other),
            Converted::List(l) => l.equals(other),
        }
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(JsonVal::new(self.json))
    }
}

impl Container for JsonVal<'_> {
    fn contains(&self, value: &dyn Val) -> Result<bool, ExecutionError> {
        match self.json {
            Json::Object(o) => Ok(value
                .downcast_ref::<CelString<'_>>()
                .is_some_and(|k| o.contains_key(k.inner()))),
            Json::Array(a) => Ok(a.iter().any(|x| to_val(x).equals(value))),
            _ => Ok(false),
        }
    }
}

fn key_name(key: &dyn Val) -> String {
    key.downcast_ref::<CelString<'_>>()
        .map(|s| s.inner().to_owned())
        .or_else(|| key.downcast_ref::<CelInt>().map(|i| i.inner().to_string()))
        .or_else(|| key.downcast_ref::<CelUInt>().map(|u| u.inner().to_string()))
        .unwrap_or_default()
}

impl<'v> Indexer for JsonVal<'v> {
    fn get<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let found = match self.json {
            Json::Object(o) => key
                .downcast_ref::<CelString<'_>>()
                .and_then(|k| o.get(k.inner())),
            Json::Array(a) => {
                let i = if let Some(i) = key.downcast_ref::<CelInt>() {
                    usize::try_from(*i.inner()).ok()
                } else if let Some(u) = key.downcast_ref::<CelUInt>() {
                    usize::try_from(*u.inner()).ok()
                } else if let Some(d) = key.downcast_ref::<CelDouble>() {
                    let d = *d.inner();
                    (d.fract() == 0.0 && d >= 0.0).then_some(d as usize)
                } else {
                    return Err(ExecutionError::UnexpectedType {
                        got: key.get_type().name().to_owned(),
                        want: "int".to_owned(),
                    });
                };
                match i.and_then(|i| a.get(i)) {
                    Some(x) => Some(x),
                    None => {
                        return Err(ExecutionError::IndexOutOfBounds(
                            key.try_into().unwrap_or(::cel::Value::Null),
                        ));
                    }
                }
            }
            _ => None,
        };
        match found {
            Some(x) => Ok(CowVal::Owned(to_val(x))),
            None => Err(ExecutionError::no_such_key(&key_name(key))),
        }
    }

    fn steal<'w>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(key).map(CowVal::into_owned)
    }
}

impl<'v> Iterable for JsonVal<'v> {
    fn iter<'b, 'w>(&'b self) -> Box<dyn traits::Iterator<'b, 'w> + 'b>
    where
        Self: 'w,
    {
        let items = self.items.get_or_init(|| match self.json {
            Json::Object(o) => o
                .keys()
                .map(|k| Box::new(CelString::from(k.as_str())) as Box<dyn Val + 'v>)
                .collect(),
            Json::Array(a) => a.iter().map(to_val).collect(),
            _ => Vec::new(),
        });
        Box::new(Items { items, pos: 0 })
    }
}

struct Items<'b, 'v> {
    items: &'b [Box<dyn Val + 'v>],
    pos: usize,
}

impl<'b, 'v: 'w, 'w> traits::Iterator<'b, 'w> for Items<'b, 'v> {
    fn next(&mut self) -> Option<&'b (dyn Val + 'w)> {
        let item = self.items.get(self.pos)?;
        self.pos += 1;
        Some(item.as_ref())
    }
}

impl Sizer for JsonVal<'_> {
    fn size(&self) -> CelInt {
        let n = match self.json {
            Json::Object(o) => o.len(),
            Json::Array(a) => a.len(),
            _ => 0,
        };
        CelInt::from(n as i64)
    }
}

impl Zeroer for JsonVal<'_> {
    fn is_zero_value(&self) -> bool {
        match self.json {
            Json::Object(o) => o.is_empty(),
            Json::Array(a) => a.is_empty(),
            _ => true,
        }
    }
}
